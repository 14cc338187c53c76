"""Pure parts of the merge and publish RPCs: roles, error mapping, the ABORTED status details."""

from __future__ import annotations

import grpc
import orjson
import pytest
from google.rpc import status_pb2

from api import world_manager_pb2 as pb
from api.auth import Principal, Role, authorize
from api.errors import HeadMoved, PermissionDenied, status_for
from api.merge_rpcs import DETAILS_BUDGET, conflict_message, conflict_status, pending_response
from worlds.merge import MergeError
from worlds.publish import PublishError


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


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (MergeError("no pending merge into w1"), grpc.StatusCode.NOT_FOUND),
        (MergeError("no conflict 9 in the pending merge into w1"), grpc.StatusCode.NOT_FOUND),
        (MergeError("source and target are the same world"), grpc.StatusCode.INVALID_ARGUMENT),
        (MergeError("unknown merge strategy 'X'; use one of NORMAL"), grpc.StatusCode.INVALID_ARGUMENT),
        (
            MergeError("world w1 moved since the pending merge was planned; run the merge again"),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (MergeError("worlds a and b share no history: no merge base"), grpc.StatusCode.FAILED_PRECONDITION),
        (PublishError("unknown plan pl-1: run `causeway publish audit` first"), grpc.StatusCode.NOT_FOUND),
        (PublishError("source and target must differ"), grpc.StatusCode.INVALID_ARGUMENT),
        (PublishError("thresholds: --max-drift must be >= 0 and --max-tables >= 1"), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_merge_and_publish_errors_map_to_status_codes(error: Exception, code: grpc.StatusCode) -> None:
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
