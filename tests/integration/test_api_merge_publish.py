"""Merge and Write-Audit-Publish RPCs over a real gRPC channel against `causeway serve`, Nessie and Redis."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import orjson
import pytest

from api import world_manager_pb2 as pb
from api.client import WorldClient
from bench.api_load import ApiProcess, start_api
from streams.settings import Settings
from tests.integration import api_fixtures as afx
from tests.integration import api_merge_fixtures as amf
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import obj
from tests.integration.worlds_fixtures import fork
from worlds.api import Worlds
from worlds.publish_run import Publisher

pytestmark = pytest.mark.integration
world_settings, wclient, written, api = fx.world_settings, fx.wclient, fx.written, fx.api
api_settings = afx.api_settings
server, pair = amf.server, amf.pair


def _error(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _names(api: Worlds, world: str) -> dict[str, str]:
    snap = api.show(world)
    return {r["object_pk"]: orjson.loads(r["properties"])["name"] for r in snap.objects.to_pylist()}


def test_clean_merge_dry_run_then_same_key_twice_has_one_effect(pair, api: Worlds, server: ApiProcess) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="src"), obj(s, "p9", "CREATE", 1, name="new")])
    before = target.commit("t1", [obj(t, "p3", "UPDATE", 2, name="tgt")])
    with server.client("operator") as c:
        dry = c.merge_world(s, t, dry_run=True)
        assert dry.status == "planned" and not dry.conflicts and api.head(t).hash == before
        first = c.merge_world(s, t, message="merge over the API", idempotency_key="merge-k1")
        assert first.status == "merged" and first.commit_hash == api.head(t).hash != before
        assert first.target_head == before and first.source_hash == api.head(s).hash
        again = c.merge_world(s, t, message="merge over the API", idempotency_key="merge-k1")
        assert again == first and api.head(t).hash == first.commit_hash  # the stored outcome, no second merge
        fresh = c.merge_world(s, t, idempotency_key="merge-k2")  # a new key runs again: nothing left to merge
        assert fresh.status == "nothing-to-merge" and api.head(t).hash == first.commit_hash
        # operator into prod needs admin; a reader may not merge at all (no lookup: the worlds need not exist)
        denied = _error(lambda: c.merge_world(s, server.settings.prod_world))
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
    with server.client("reader") as r:
        assert _error(lambda: r.merge_world(s, t)).code() == grpc.StatusCode.PERMISSION_DENIED
    assert _names(api, t) == {"p1": "src", "p2": "n2", "p3": "tgt", "p4": "n4", "p9": "new"}
    runs = [(e["result"], e["replayed"]) for e in server.audit() if e["idempotency_key"] == "merge-k1"]
    assert runs == [("OK", False), ("OK", True)]


def test_normal_merge_conflicts_are_aborted_with_the_conflicts_in_the_details(
    pair, api: Worlds, server: ApiProcess
) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="src"), obj(s, "p2", "UPDATE", 2, name="src2")])
    head = target.commit("t1", [obj(t, "p1", "UPDATE", 2, name="tgt"), obj(t, "p4", "DELETE", 2)])
    with server.client("operator") as c:
        err = _error(lambda: c.merge_world(s, t, idempotency_key="conflict-k"))
        assert err.code() == grpc.StatusCode.ABORTED and "1 conflict" in err.details()
        details = WorldClient.conflicts_of(err)
        assert details is not None and details.status == "conflicts" and details.target_head == head
        assert [(x.kind, x.entity_type, x.pk, x.conflict) for x in details.conflicts] == [
            ("object", "person", "p1", "MODIFY_MODIFY")
        ]
        assert api.head(t).hash == head  # nothing written
        replay = _error(lambda: c.merge_world(s, t, idempotency_key="conflict-k"))
        assert replay.code() == grpc.StatusCode.ABORTED and WorldClient.conflicts_of(replay) == details
        # a dry run answers OK with every conflict and its three states
        dry = c.merge_world(s, t, dry_run=True)
        assert dry.status == "conflicts" and len(dry.conflicts) == 1
        states = orjson.loads(dry.conflicts[0].json)
        assert (states["source"]["properties"]["name"], states["target"]["properties"]["name"]) == ("src", "tgt")
    aborted = [e for e in server.audit() if e["idempotency_key"] == "conflict-k"]
    assert [(e["result"], e["replayed"]) for e in aborted] == [("ABORTED", False), ("ABORTED", True)]


def test_manual_merge_listed_aborted_resolved_and_continued(pair, api: Worlds, server: ApiProcess) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="src1"), obj(s, "p2", "UPDATE", 2, name="src2")])
    source.commit("s2", [obj(s, "p9", "CREATE", 1, name="new")])
    head = target.commit("t1", [obj(t, "p1", "UPDATE", 2, name="tgt1"), obj(t, "p2", "UPDATE", 2, name="tgt2")])
    with server.client("operator") as c, server.client("reader") as r:
        pending = c.merge_world(s, t, "MANUAL")
        assert pending.status == "pending" and not pending.commit_hash and api.head(t).hash == head
        assert sorted((x.id, x.pk) for x in pending.conflicts) == [(1, "p1"), (2, "p2")]
        assert c.abort_merge(t) is True
        assert _error(lambda: r.list_conflicts(t)).code() == grpc.StatusCode.NOT_FOUND
        assert _error(lambda: c.abort_merge(t)).code() == grpc.StatusCode.NOT_FOUND

        c.merge_world(s, t, "MANUAL")
        listed = r.list_conflicts(t)  # a reader may list
        assert (listed.source_world_id, listed.target_head) == (s, head)
        ids = {x.pk: x.id for x in listed.conflicts}
        assert set(ids) == {"p1", "p2"} and all(not x.resolution for x in listed.conflicts)
        assert _error(lambda: r.resolve_conflict(t, ids["p1"], "source")).code() == grpc.StatusCode.PERMISSION_DENIED
        bad = _error(lambda: c.resolve_conflict(t, ids["p1"], "mine"))
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _error(lambda: c.resolve_conflict(t, 99, "source")).code() == grpc.StatusCode.NOT_FOUND

        assert c.resolve_conflict(t, ids["p1"], "source").resolution == "source"
        c.resolve_conflict(t, ids["p2"], 'value={"name": "chosen"}')
        chosen = {x.pk: x.resolution for x in r.list_conflicts(t).conflicts}
        assert chosen == {"p1": "source", "p2": 'value={"name": "chosen"}'}
        done = c.continue_merge(t, "resolved over the API")
        assert done.status == "merged" and done.commit_hash == api.head(t).hash
    assert _names(api, t) == {"p1": "src1", "p2": "chosen", "p3": "n3", "p4": "n4", "p9": "new"}
    with server.client("reader") as r:
        assert _error(lambda: r.list_conflicts(t)).code() == grpc.StatusCode.NOT_FOUND  # finished
    methods = [e["method"] for e in server.audit() if e["world"] == t and e["result"] == "OK"]
    assert methods.count("ResolveConflict") == 2 and methods.count("ContinueMerge") == 1


def test_publish_audit_approve_run_fast_forward_and_moved_head_refused(
    pair, api: Worlds, server: ApiProcess, unique: str
) -> None:
    target, source = pair
    t, s = target.world, source.world
    log = Publisher(api, log_branch=f"publish-log-{unique}").log
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl")])
    with server.client("operator") as c:
        rec = c.publish_audit(s, t, idempotency_key="audit-k")
        assert rec.verdict == "eligible" and rec.fast_forward and rec.source_hash == api.head(s).hash
        assert c.publish_audit(s, t, idempotency_key="audit-k") == rec  # same key: the stored record
        assert [e["kind"] for e in log.entries(rec.plan_id)] == ["audit"]  # one effect
        assert c.publish_audit(s, t).plan_id == rec.plan_id  # same heads, new key: audited again
        assert [e["kind"] for e in log.entries(rec.plan_id)] == ["audit", "audit"]

        not_approved = _error(lambda: c.publish_run(rec.plan_id, t))
        assert not_approved.code() == grpc.StatusCode.FAILED_PRECONDITION and "not approved" in not_approved.details()
        assert _error(lambda: c.publish_approve(rec.plan_id)).code() == grpc.StatusCode.PERMISSION_DENIED  # prod
        assert _error(lambda: c.publish_approve(rec.plan_id, f"other{unique}")).code() == grpc.StatusCode.NOT_FOUND
        assert c.publish_approve(rec.plan_id, t).by == "test-operator"
        moved = target.commit("t1", [obj(t, "p4", "UPDATE", 2, name="late")])
        refused = _error(lambda: c.publish_run(rec.plan_id, t))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "re-audit" in refused.details()
        assert api.head(t).hash == moved  # nothing published

        etl = fork(target, api, f"{t}-etl2")  # a source forked from the moved head: a fast-forward again
        etl.commit("e1", [obj(etl.world, "p2", "UPDATE", 2, name="etl2"), obj(etl.world, "p8", "CREATE", 1, name="x")])
        plan = c.publish_audit(etl.world, t)
        assert plan.verdict == "eligible" and plan.fast_forward and plan.target_hash == moved
        c.publish_approve(plan.plan_id, t)
        dry = c.publish_run(plan.plan_id, t, dry_run=True)
        assert dry.outcome == "planned" and api.head(t).hash == moved
        out = c.publish_run(plan.plan_id, t, idempotency_key="run-k")
        assert (out.outcome, out.path, out.verified, out.source_deleted) == ("published", "fast-forward", True, True)
        assert api.head(t).hash == plan.source_hash == out.commit_hash
        assert c.publish_run(plan.plan_id, t, idempotency_key="run-k") == out  # same key: stored, one effect
        later = c.publish_run(plan.plan_id, t)  # new key: the gate answers with the first run's result
        assert later.action == "done" and later.commit_hash == out.commit_hash
    assert _names(api, t) == {"p1": "n1", "p2": "etl2", "p3": "n3", "p4": "late", "p8": "x"}
    runs = [e for e in log.entries(plan.plan_id) if e["kind"] == "run"]
    assert [(r["outcome"], r["by"]) for r in runs] == [("published", "test-operator")]


def test_same_merge_key_from_two_clients_at_once_has_one_effect(pair, api: Worlds, server: ApiProcess) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p2", "UPDATE", 2, name="src")])
    before = target.commit("t1", [obj(t, "p3", "UPDATE", 2, name="tgt")])
    answers: list[object] = []

    def merge() -> None:
        with server.client("operator") as c:
            try:
                answers.append(c.merge_world(s, t, idempotency_key="merge-race"))
            except grpc.RpcError as exc:  # kept: the assertion below shows it
                answers.append(exc)

    threads = [threading.Thread(target=merge) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(isinstance(a, type(answers[0])) for a in answers) and answers[0] == answers[1], answers
    merged = answers[0]
    assert merged.status == "merged" and merged.commit_hash == api.head(t).hash  # type: ignore[union-attr]
    history = [c for page in api.client.history(api.branch(t), max_records=5) for c in page]
    assert history[1].hash == before  # one merge commit on top of the planned head, not two
    runs = [(e["result"], e["replayed"]) for e in server.audit() if e["idempotency_key"] == "merge-race"]
    assert sorted(runs) == [("OK", False), ("OK", True)]


def test_publish_run_by_three_way_merge_when_the_target_moved_before_the_audit(
    pair, api: Worlds, server: ApiProcess
) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl")])
    target.commit("t1", [obj(t, "p4", "UPDATE", 2, name="prod")])
    with server.client("operator") as c:
        plan = c.publish_audit(s, t)
        assert plan.verdict == "eligible" and not plan.fast_forward
        c.publish_approve(plan.plan_id, t)
        out = c.publish_run(plan.plan_id, t, keep_source=True)
        assert (out.outcome, out.path, out.verified, out.source_deleted) == ("published", "merge", True, False)
        assert api.head(t).hash == out.commit_hash
    assert _names(api, t) == {"p1": "etl", "p2": "n2", "p3": "n3", "p4": "prod"}


def test_list_conflicts_pages_with_a_token_pinned_to_one_pending_merge(pair, server: ApiProcess) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, f"p{i}", "UPDATE", 2, name=f"src{i}") for i in range(1, 5)])
    target.commit("t1", [obj(t, f"p{i}", "UPDATE", 2, name=f"tgt{i}") for i in range(1, 5)])
    with server.client("operator") as c, server.client("reader") as r:
        assert c.merge_world(s, t, "MANUAL").status == "pending"
        first = r.conflicts_page(t, page_size=3)
        assert [x.id for x in first.conflicts] == [1, 2, 3] and first.total == 4 and first.next_page_token
        second = r.conflicts_page(t, page_size=3, page_token=first.next_page_token)
        assert [x.id for x in second.conflicts] == [4] and not second.next_page_token
        assert sorted(x.pk for x in [*first.conflicts, *second.conflicts]) == ["p1", "p2", "p3", "p4"]
        joined = r.list_conflicts(t, page_size=1)  # the client follows the tokens
        assert [x.id for x in joined.conflicts] == [1, 2, 3, 4] and not joined.next_page_token
        bad = _error(lambda: r.conflicts_page(t, page_token="bm90LWEtdG9rZW4"))  # not a token of this listing
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
        # the merge is replaced between two pages: the old token is refused, never mixed with the new one
        c.abort_merge(t)
        c.merge_world(s, t, "MANUAL")
        stale = _error(lambda: r.conflicts_page(t, page_size=3, page_token=first.next_page_token))
        assert stale.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_publish_status_and_log_are_paged_reads(pair, api: Worlds, server: ApiProcess) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl")])
    other = fork(target, api, f"{t}-b")
    with server.client("operator") as c:
        plan = c.publish_audit(s, t)
        c.publish_audit(other.world, t)  # up to date: nothing new in it
        c.publish_approve(plan.plan_id, t)
        out = c.publish_run(plan.plan_id, t)
    with server.client("reader") as r:  # reads: a reader may call them
        states = r.publish_status(page_size=1)  # one source per page: every token followed
        assert [x.source for x in states] == sorted([s, other.world])
        mine = next(x for x in states if x.source == s)
        assert (mine.target, mine.plan_id, mine.verdict, mine.outcome) == (t, plan.plan_id, "eligible", "published")
        entries = [orjson.loads(e) for e in r.publish_log(plan.plan_id, page_size=1)]
        assert [e["kind"] for e in entries] == ["audit", "approve", "run"]
        assert entries[1]["by"] == "test-operator" and entries[2]["commit"] == out.commit_hash
        assert len(r.publish_log(page_size=2)) == 4  # the whole log: two audits, the approval, the run
        first = r.call("ListPublishLog", pb.ListPublishLogRequest(plan_id=plan.plan_id, page_size=1))
        foreign = pb.ListPublishLogRequest(plan_id="pl-0000000000000000", page_token=first.next_page_token)
        assert _error(lambda: r.call("ListPublishLog", foreign)).code() == grpc.StatusCode.INVALID_ARGUMENT
    with server.client(token="cwy_wrong") as nobody:
        assert _error(lambda: nobody.publish_status()).code() == grpc.StatusCode.UNAUTHENTICATED


def test_server_killed_mid_publish_run_then_retry_publishes_once(
    pair, api: Worlds, api_settings: Settings, tmp_path: Path, unique: str
) -> None:
    """SIGKILL right after the fast-forward landed (before verify, cleanup, log and the stored outcome);
    the retry with the same key finishes the publish: one publish, the source deleted, logged once."""
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl")])
    settings = api_settings.replace(data_dir=str(tmp_path / "data"), publish_log_branch=f"publish-log-{unique}")
    doomed = start_api(settings, tmp_path, fault="publish-after-commit:1")
    with doomed.client("operator") as c:
        plan = c.publish_audit(s, t)
        c.publish_approve(plan.plan_id, t)
        lost = _error(lambda: c.publish_run(plan.plan_id, t, idempotency_key="run-crash"))
        assert lost.code() == grpc.StatusCode.UNAVAILABLE
    doomed.proc.wait(timeout=30)
    assert doomed.proc.returncode == -9
    assert api.head(t).hash == plan.source_hash  # the publish landed before the kill
    log = Publisher(api, log_branch=settings.publish_log_branch).log
    assert [e["kind"] for e in log.entries(plan.plan_id)] == ["audit", "approve"]  # not logged yet

    again = start_api(settings, tmp_path, tokens=doomed.tokens)
    try:
        with again.client("operator") as c:
            # the dead holder's lease expires; the retry runs the gate, which finds the publish on the target
            out = c.publish_run(plan.plan_id, t, idempotency_key="run-crash")
            assert (out.outcome, out.action, out.commit_hash) == ("published", "complete", plan.source_hash)
            assert out.verified and out.source_deleted
            assert c.publish_run(plan.plan_id, t, idempotency_key="run-crash") == out  # now stored
    finally:
        again.stop()
    runs = [e for e in log.entries(plan.plan_id) if e["kind"] == "run"]
    assert [(r["outcome"], r["action"]) for r in runs] == [("published", "complete")]
    assert api.head(t).hash == plan.source_hash  # nothing published twice: still the source head
