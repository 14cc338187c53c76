"""Pure parts of the merge and publish RPCs: roles, error mapping, status details, paging of the publish reads."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import grpc
import orjson
import pytest
from google.rpc import status_pb2

from api import paging
from api import world_manager_pb2 as pb
from api.auth import Principal, Role, authorize
from api.errors import ApiError, HeadMoved, InvalidRequest, PermissionDenied, status_for
from api.merge_rpcs import DETAILS_BUDGET, conflict_message, conflict_status, pending_response
from api.publish_rpcs import log_page, run_response, status_page
from api.remote_publish import branch_state, run_outcome
from worlds.merge import InvalidMerge, MergeError, MergeMoved, MergeNotFound, Strategies, Strategy
from worlds.merge_run import PendingStore
from worlds.publish import (
    BranchState,
    Heads,
    InvalidPublish,
    PlanNotFound,
    PublishError,
    PublishMoved,
    Thresholds,
)
from worlds.publish_run import RunOutcome


def test_merge_and_publish_roles_follow_the_target_world() -> None:
    reader, operator, admin = (Principal(r.name, r) for r in (Role.reader, Role.operator, Role.admin))
    authorize(reader, "ListConflicts", "w1", "prod")
    for method in ("MergeWorld", "ResolveConflict", "ContinueMerge", "AbortMerge", "PublishApprove", "PublishRun"):
        with pytest.raises(PermissionDenied):
            authorize(reader, method, "w1", "prod")
        authorize(operator, method, "w1", "prod")
        with pytest.raises(PermissionDenied, match="needs role admin"):
            authorize(operator, method, "prod", "prod")
        authorize(admin, method, "prod", "prod")
    authorize(operator, "PublishAudit", "etl-1", "prod")


def _raised(fn: Callable[[], object]) -> Exception:
    try:
        fn()
    except Exception as exc:  # the error under test, whatever it is
        return exc
    raise AssertionError("nothing raised")


@pytest.mark.parametrize(
    ("make", "code"),
    [
        # Raised by the real code paths: the kind travels with the type.
        (lambda tmp: PendingStore(tmp).load("w1"), grpc.StatusCode.NOT_FOUND),
        (lambda tmp: Strategy.parse("SOMETIMES"), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda tmp: Strategies.parse("NORMAL", ["person"]), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda tmp: Thresholds(max_drift=-1).validate(), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda tmp: Heads("w1", "w1", "a", "b", "c").validate(), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_merge_and_publish_refusals_raised_by_the_code_map_to_status_codes(
    make: Callable[[Path], object], code: grpc.StatusCode, tmp_path: Path
) -> None:
    error = _raised(lambda: make(tmp_path))
    assert status_for(error) == (code, str(error))


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (MergeNotFound("no conflict 9 in the pending merge into w1"), grpc.StatusCode.NOT_FOUND),
        (InvalidMerge("source and target are the same world"), grpc.StatusCode.INVALID_ARGUMENT),
        (MergeMoved("world w1 moved since the pending merge was planned"), grpc.StatusCode.FAILED_PRECONDITION),
        (MergeError("worlds a and b share no history: no merge base"), grpc.StatusCode.FAILED_PRECONDITION),
        (PlanNotFound("unknown plan pl-1: run `causeway publish audit` first"), grpc.StatusCode.NOT_FOUND),
        (InvalidPublish("--by NAME is required"), grpc.StatusCode.INVALID_ARGUMENT),
        (PublishMoved("target w1 moved since the audit: re-audit"), grpc.StatusCode.FAILED_PRECONDITION),
        (PublishError("plan pl-1 is blocked (drift): cannot approve"), grpc.StatusCode.FAILED_PRECONDITION),
        # The message is never read: a plain area error saying "does not exist" is a precondition.
        (MergeError("no pending merge into w1"), grpc.StatusCode.FAILED_PRECONDITION),
        (PublishError("unknown plan pl-1"), grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
def test_merge_and_publish_errors_map_to_status_codes_by_type(error: Exception, code: grpc.StatusCode) -> None:
    assert status_for(error) == (code, str(error))


def test_conflict_details_are_a_rich_status_capped_under_the_metadata_limit() -> None:
    conflicts = [
        conflict_message(
            {"kind": "object", "type": "person", "pk": f"p{i:05d}", "conflict": "MODIFY_MODIFY", "base": {}}
        )
        for i in range(500)
    ]
    resp = pb.MergeResponse(status="conflicts", conflicts=conflicts, source_hash="a" * 64, target_head="b" * 64)
    message, raw = conflict_status("merge met 500 conflicts", resp)
    assert len(raw) < 8192 and "the first" in message and "of 500" in message
    status = status_pb2.Status.FromString(raw)
    assert (status.code, status.message) == (grpc.StatusCode.ABORTED.value[0], message)
    got = pb.MergeResponse()
    assert status.details[0].Unpack(got)
    assert 10 < len(got.conflicts) < 500 and got.conflicts[0].pk == "p00000"
    brief = orjson.loads(got.conflicts[0].json)  # the conflict without its three states (CLI output needs it)
    assert brief == {"kind": "object", "type": "person", "pk": "p00000", "conflict": "MODIFY_MODIFY"}
    assert got.ByteSize() <= DETAILS_BUDGET

    few = pb.MergeResponse(status="conflicts", conflicts=conflicts[:3])
    message, raw = conflict_status("merge met 3 conflicts", few)
    assert message == "merge met 3 conflicts"  # all of them fit: nothing is said about a cut


def test_pending_conflicts_are_paged_by_id_with_a_token_pinned_to_the_merge() -> None:
    doc = {
        "source": "s",
        "target": "t",
        "source_hash": "a" * 64,
        "target_head": "b" * 64,
        "base": "c" * 64,
        "created": "2026-11-30T10:00:00+00:00",
        "conflicts": [
            {"id": i, "kind": "object", "type": "person", "pk": f"p{i}", "conflict": "MODIFY_MODIFY"}
            for i in (5, 3, 1, 4, 2)
        ],
        "resolutions": {"object/person/p2/MODIFY_MODIFY": "source"},
    }
    pages, token = [], ""
    while True:
        page = pending_response(doc, 2, token)
        pages.append([(c.id, c.resolution) for c in page.conflicts])
        assert page.total == 5
        token = page.next_page_token
        if not token:
            break
    assert pages == [[(1, ""), (2, "source")], [(3, ""), (4, "")], [(5, "")]]
    header = orjson.loads(page.json)
    assert "conflicts" not in header and header["resolutions"] == doc["resolutions"]
    first = pending_response(doc, 2).next_page_token
    with pytest.raises(HeadMoved):  # the pending merge was replaced: the old token is refused
        pending_response(doc | {"created": "2026-11-30T11:00:00+00:00"}, 2, first)


def test_publish_reads_are_for_readers_and_deleting_a_release_for_admins() -> None:
    reader, operator, admin = (Principal(r.name, r) for r in (Role.reader, Role.operator, Role.admin))
    for method in ("PublishStatus", "ListPublishLog"):
        authorize(reader, method, None, "prod")
    for who in (reader, operator):
        with pytest.raises(PermissionDenied, match="needs role admin"):
            authorize(who, "DeleteRelease", "w1", "prod")
    authorize(admin, "DeleteRelease", "w1", "prod")


def _outcome(outcome: str) -> RunOutcome:
    out = RunOutcome("pl-1", "refuse" if outcome == "refused" else "fast-forward", outcome, "why", True)
    out.path, out.commit, out.verified = "fast-forward", "c" * 64, outcome == "published"
    out.detail["merge"] = {"status": "merged", "added": 2}
    return out


@pytest.mark.parametrize(
    ("outcome", "code"), [("refused", grpc.StatusCode.FAILED_PRECONDITION), ("failed", grpc.StatusCode.INTERNAL)]
)
def test_a_refused_or_failed_run_carries_its_outcome_in_the_status_details(outcome: str, code: grpc.StatusCode) -> None:
    out = _outcome(outcome)
    with pytest.raises(ApiError) as info:
        run_response(out)
    assert status_for(info.value) == (code, f"publish pl-1 {outcome}: why")
    status = status_pb2.Status.FromString(info.value.status_details)
    carried = pb.PublishRunResponse()
    assert status.code == code.value[0] and status.details[0].Unpack(carried)
    back = run_outcome(carried)  # what the CLI prints over the API: the gate's own record
    assert back == out and back.to_json() == out.to_json()


def test_a_published_run_round_trips_through_its_message() -> None:
    out = _outcome("published")
    assert run_outcome(run_response(out)).to_json() == out.to_json()


def _state(source: str) -> BranchState:
    at = datetime(2026, 11, 30, 10, tzinfo=UTC)
    return BranchState(source, "prod", f"pl-{source}", "eligible", (), at, at, None, 0, None)


def test_publish_status_pages_by_source_and_round_trips() -> None:
    states = {s: _state(s) for s in ("c", "a", "b")}
    first = status_page(states, 2, "")
    assert [s.source for s in first.states] == ["a", "b"] and first.next_page_token
    second = status_page(states, 2, first.next_page_token)
    assert [s.source for s in second.states] == ["c"] and not second.next_page_token
    assert branch_state(first.states[0]) == states["a"]
    with pytest.raises(InvalidRequest):
        status_page(states, 2, paging.encode("worlds", after="a"))


def test_publish_log_pages_resume_after_the_last_entry_sent() -> None:
    entries = [{"kind": "audit", "plan_id": "pl-1", "log_commit": f"h{i}"} for i in range(5)]
    got, token = [], ""
    while True:
        page = log_page(entries, 2, token)
        got += [orjson.loads(e)["log_commit"] for e in page.entries_json]
        token = page.next_page_token
        if not token:
            break
    assert got == ["h0", "h1", "h2", "h3", "h4"]
    with pytest.raises(InvalidRequest):  # a token naming an entry the log does not hold
        log_page(entries[:1], 2, log_page(entries, 2, "").next_page_token)
