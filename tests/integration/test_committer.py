"""The batch committer against the real Nessie: atomicity, OCC, unknown outcomes, time travel, forks."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sinks.catalog import NessieCatalog
from sinks.committed_offsets import OffsetSet
from sinks.committer import Batch, BatchCommitter, RetriesExhausted, Source
from sinks.errors import CommitStateUnknown, TableUnreadable
from sinks.keyfilter import MIN_ROWS, Probe
from sinks.nessie import SyncNessieClient
from streams.settings import Settings
from tests.integration.commits import LNK, OBJ, batch, batch_commits, empty_root, event_ids, link, obj, objects

pytestmark = pytest.mark.integration


def test_batch_applies_log_and_projections_in_one_commit(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    committer = BatchCommitter(sink_settings, client)
    branch = f"world-{world}"
    first = [obj(world, f"p{i}", "CREATE", 1, n=i) for i in range(10)] + [link(world, "l1", 1, "p0", "p1")]
    out = committer.commit_batch(batch(world, "b1", first, 0))
    assert not out.already_committed and out.events_appended == 11 and out.attempts == 1
    second = [
        obj(world, "p0", "UPDATE", 2, n=100),
        obj(world, "p1", "UPDATE", 1, n=-1),  # stale: version 1 is stored
        obj(world, "p2", "DELETE", 2),
        obj(world, "x1", "CREATE", 1, typ="org"),
    ]
    out = committer.commit_batch(batch(world, "b2", second, 11))
    assert out.events_stale == 1
    cat = committer.catalog(branch)
    state = objects(cat)
    assert state["p0"] == (2, False, '{"n":100}')
    assert state["p1"] == (1, False, '{"n":1}')
    assert state["p2"] == (2, True, None)
    assert len(state) == 11
    edges = cat.load_table("onto.entity_edge").scan().to_arrow().to_pylist()
    assert [(e["link_pk"], e["from_pk"], e["to_pk"]) for e in edges] == [("l1", "p0", "p1")]
    log = cat.load_table("onto.entity_events").scan().to_arrow()
    assert log.num_rows == 15
    assert pc.sum(pc.invert(log.column("applied"))).as_py() == 1
    # Commit metadata: one commit for b2, with world, batch id, count and exact offsets.
    page = next(iter(client.history(branch, max_records=1)))
    props = page.items[0].properties
    assert props["causeway.world"] == world and props["causeway.batch_id"] == "b2"
    assert props["causeway.event_count"] == "4"
    assert props[f"causeway.offsets.{OBJ}/0"] == "11-14"
    assert page.items[0].author == sink_settings.commit_author
    # A truncate removes every row of the type.
    committer.commit_batch(batch(world, "b3", [obj(world, "*", "TRUNCATE", 0)], 15))
    assert set(objects(cat)) == {"x1"}


def test_offsets_with_gaps_read_back_and_replays_are_skipped(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    committer = BatchCommitter(sink_settings, client)
    branch = f"world-{world}"
    events = [obj(world, f"p{i}", "CREATE", 1) for i in range(6)]
    # Offset 3 is parked in the causal gate: the batch covers 0-2 and 4-6 on partition 2.
    items = [(e, Source(OBJ, 2, o)) for e, o in zip(events, [0, 1, 2, 4, 5, 6], strict=True)]
    committer.commit_batch(Batch.from_sources(world, "g1", items))
    offsets = committer.committed_offsets(branch)
    assert 3 not in offsets[(OBJ, 2)] and all(o in offsets[(OBJ, 2)] for o in (0, 1, 2, 4, 5, 6))
    assert offsets[(OBJ, 2)].format() == "4-6"  # 0-2 folded into the floor (3)
    # A replay of the same offsets after a crash commits nothing and appends no duplicate.
    out = committer.commit_batch(Batch.from_sources(world, "g1-replay", items))
    assert out.already_committed and out.events_replayed == 6
    assert len(event_ids(committer.catalog(branch))) == 6
    # The parked event arrives: the set closes.
    committer.commit_batch(Batch.from_sources(world, "g2", [(obj(world, "p9", "CREATE", 1), Source(OBJ, 2, 3))]))
    assert committer.committed_offsets(branch)[(OBJ, 2)] == OffsetSet(floor=7)


def test_failure_between_staging_and_publish_changes_nothing(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    branch = f"world-{world}"
    BatchCommitter(sink_settings, client).commit_batch(batch(world, "seed", [obj(world, "p1", "CREATE", 1)], 0))
    head = client.get_reference(branch).hash

    def crash(cat: NessieCatalog, b: Batch, attempt: int) -> None:
        assert len(cat.staged_tables) == 2  # entity_events and entity_common are staged
        raise RuntimeError("worker died before publishing")

    failing = BatchCommitter(sink_settings, client, before_publish=crash)
    with pytest.raises(RuntimeError):
        failing.commit_batch(batch(world, "lost", [obj(world, "p1", "UPDATE", 2), obj(world, "p2", "CREATE", 1)], 1))
    assert client.get_reference(branch).hash == head
    cat = BatchCommitter(sink_settings, client).catalog(branch)
    assert objects(cat) == {"p1": (1, False, "{}")} and len(event_ids(cat)) == 1


def test_eight_concurrent_committers_on_one_branch_lose_no_update(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    branch = f"world-{world}"
    settings = sink_settings.replace(commit_retries=60)
    errors: list[BaseException] = []
    outcomes = []
    start = threading.Barrier(8)
    retries: list[tuple[str, str]] = []

    def run(n: int) -> None:
        committer = BatchCommitter(settings, client, on_retry=lambda w, reason: retries.append((w, reason)))
        events = [obj(world, f"w{n}-{i}", "CREATE", 1, writer=n) for i in range(20)]
        # Every writer also bumps the shared key "shared" with a distinct version.
        events.append(obj(world, "shared", "UPDATE", n + 1, writer=n))
        start.wait()
        try:
            outcomes.append(committer.commit_batch(batch(world, f"c{n}", events, n * 100, partition=n)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(o.attempts for o in outcomes) > 8, "writers on one branch should have met conflicts"
    # Every retry was reported (for the OCC metrics), as a conflict of this world.
    assert len(retries) == sum(o.attempts - 1 for o in outcomes)
    assert set(retries) == {(world, "conflict")}
    cat = BatchCommitter(settings, client).catalog(branch)
    state = objects(cat)
    assert {pk for pk in state if pk != "shared"} == {f"w{n}-{i}" for n in range(8) for i in range(20)}
    assert state["shared"][0] == 8  # the highest version wins whatever the commit order
    assert len(event_ids(cat)) == 8 * 21 and len(set(event_ids(cat))) == 8 * 21
    offsets = BatchCommitter(settings, client).committed_offsets(branch)
    assert {tp for tp in offsets} == {(OBJ, n) for n in range(8)}
    for n in range(8):
        assert len(batch_commits(client, branch, f"c{n}")) == 1


def test_writers_on_different_branches_never_conflict(
    client: SyncNessieClient, sink_settings: Settings, unique: str
) -> None:
    worlds = [f"t{unique}-{n}" for n in range(4)]
    for w in worlds:
        client.create_branch(f"world-{w}", empty_root(client))
    outcomes = []
    start = threading.Barrier(len(worlds))

    def run(w: str) -> None:
        committer = BatchCommitter(sink_settings, client)
        start.wait()
        for k in range(3):
            outcomes.append(committer.commit_batch(batch(w, f"{w}-{k}", [obj(w, f"p{k}", "CREATE", 1)], k)))

    threads = [threading.Thread(target=run, args=(w,)) for w in worlds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 12 and all(o.attempts == 1 for o in outcomes)


def lost_answer_on(nth: int) -> type[BatchCommitter]:
    """A committer whose ``nth`` publish lands but answers CommitStateUnknown (a lost answer)."""

    class LostAnswer(BatchCommitter):
        calls = 0

        def _publish(self, cat: NessieCatalog, message: str, properties: dict[str, str]) -> str:
            LostAnswer.calls += 1
            landed = super()._publish(cat, message, properties)
            if LostAnswer.calls == nth:
                raise CommitStateUnknown(f"read timeout after sending (landed as {landed[:8]})")
            return landed

    return LostAnswer


def test_unknown_outcome_after_the_commit_landed_leaves_exactly_one_commit(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    branch = f"world-{world}"
    LostAnswer = lost_answer_on(1)
    committer = LostAnswer(sink_settings, client)
    events = [obj(world, f"p{i}", "CREATE", 1) for i in range(5)]
    out = committer.commit_batch(batch(world, "u1", events, 0))
    assert out.already_committed and LostAnswer.calls == 1
    assert len(batch_commits(client, branch, "u1")) == 1
    assert out.hash == client.get_reference(branch).hash
    assert len(event_ids(committer.catalog(branch))) == 5


def test_unknown_outcome_that_did_not_land_is_retried_once(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    branch = f"world-{world}"

    class NotSent(BatchCommitter):
        calls = 0

        def _publish(self, cat: NessieCatalog, message: str, properties: dict[str, str]) -> str:
            NotSent.calls += 1
            if NotSent.calls == 1:
                cat.discard()
                raise CommitStateUnknown("connection reset")
            return super()._publish(cat, message, properties)

    out = NotSent(sink_settings, client).commit_batch(batch(world, "u2", [obj(world, "p", "CREATE", 1)], 0))
    assert not out.already_committed and out.attempts == 2
    assert len(batch_commits(client, branch, "u2")) == 1


def test_conflicts_beyond_the_retry_limit_raise_and_commit_nothing(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    branch = f"world-{world}"
    settings = sink_settings.replace(commit_retries=2)
    BatchCommitter(settings, client).commit_batch(batch(world, "seed", [obj(world, "p", "CREATE", 1)], 0))
    rival = BatchCommitter(settings, client)
    n = iter(range(1000))

    def rival_commits_first(cat: NessieCatalog, b: Batch, attempt: int) -> None:
        k = next(n)
        rival.commit_batch(batch(world, f"rival-{k}", [obj(world, f"r{k}", "CREATE", 1)], 100 + k))

    loser = BatchCommitter(settings, client, before_publish=rival_commits_first)
    with pytest.raises(RetriesExhausted):
        loser.commit_batch(batch(world, "loser", [obj(world, "q", "CREATE", 1)], 50))
    assert batch_commits(client, branch, "loser") == []
    assert "q" not in objects(BatchCommitter(settings, client).catalog(branch))


def test_read_back_at_commit_hash_and_as_of_timestamp(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    committer = BatchCommitter(sink_settings, client)
    branch = f"world-{world}"
    h1 = committer.commit_batch(batch(world, "r1", [obj(world, "p", "CREATE", 1, v=1)], 0)).hash
    time.sleep(0.05)
    between = int(time.time() * 1000)
    time.sleep(0.05)
    committer.commit_batch(batch(world, "r2", [obj(world, "p", "UPDATE", 2, v=2)], 1))
    cat = committer.catalog(branch)
    assert objects(cat)["p"][0] == 2
    assert objects(cat.at(f"{branch}@{h1}"))["p"] == (1, False, '{"v":1}')
    assert objects(cat.as_of(between))["p"][0] == 1
    assert committer.committed_offsets(f"{branch}@{h1}")[(OBJ, 0)] == OffsetSet(floor=1)


def test_fork_a_world_write_on_the_fork_and_the_source_is_unchanged(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    committer = BatchCommitter(sink_settings, client)
    committer.commit_batch(batch(world, "f1", [obj(world, "p", "CREATE", 1)], 0))
    fork = f"{world}-fork"
    client.create_branch(f"world-{fork}", client.get_reference(f"world-{world}"))
    source_head = client.get_reference(f"world-{world}").hash
    committer.commit_batch(batch(fork, "f2", [obj(fork, "p", "UPDATE", 2), obj(fork, "q", "CREATE", 1)], 1))
    assert set(objects(committer.catalog(f"world-{fork}"))) == {"p", "q"}
    assert client.get_reference(f"world-{world}").hash == source_head
    assert objects(committer.catalog(f"world-{world}")) == {"p": (1, False, "{}")}


def test_updates_write_delete_files_not_table_rewrites(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    committer = BatchCommitter(sink_settings, client)
    branch = f"world-{world}"
    committer.commit_batch(batch(world, "m1", [obj(world, f"p{i}", "CREATE", 1) for i in range(1000)], 0))
    out = committer.commit_batch(
        batch(world, "m2", [obj(world, f"p{i}", "UPDATE", 2) for i in range(0, 1000, 100)], 1000)
    )
    st = out.stats["entity_common"]
    assert (st.rows_written, st.rows_deleted, st.rows_rewritten, st.files_removed) == (10, 10, 0, 0)
    table = committer.catalog(branch).load_table("onto.entity_common")
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    summary = snapshot.summary
    assert summary["added-position-deletes"] == "10" and summary["total-records"] == "1010"
    state = objects(committer.catalog(branch))
    assert len(state) == 1000 and state["p100"][0] == 2 and state["p101"][0] == 1


def test_snapshots_are_expired_to_bound_metadata(client: SyncNessieClient, sink_settings: Settings, world: str) -> None:
    settings = sink_settings.replace(snapshot_expire_every=3)
    committer = BatchCommitter(settings, client)
    for k in range(6):
        committer.commit_batch(batch(world, f"s{k}", [obj(world, "p", "UPDATE", k + 1)], k))
    cat = committer.catalog(f"world-{world}")
    for name in ("entity_events", "entity_common"):
        assert len(cat.load_table(("onto", name)).metadata.snapshots) <= 3
    assert objects(cat)["p"][0] == 6 and len(event_ids(cat)) == 6


async def test_async_wrapper_runs_in_a_thread(client: SyncNessieClient, sink_settings: Settings, world: str) -> None:
    committer = BatchCommitter(sink_settings, client)
    out = await committer.commit_batch_async(batch(world, "a1", [obj(world, "p", "CREATE", 1)], 0))
    assert out.events_appended == 1


def test_random_flushes_with_compaction_and_delete_merges_match_a_model(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """Aggressive compaction and delete-file merging must never change what a reader sees."""
    import random

    rng = random.Random(7)
    committer = BatchCommitter(
        sink_settings, client, compact_below=0.8, max_delete_files=3, compact_budget=1.0, max_small_files=2
    )
    branch = f"world-{world}"
    model: dict[str, tuple[int, bool]] = {}
    offset = 0
    saw_rewrite = saw_merge = False
    for k in range(12):
        events = []
        for pk in rng.sample(range(60), 15):
            key = f"p{pk}"
            version = model.get(key, (0, False))[0] + rng.choice([1, 1, 2, 0])  # 0: a stale event
            change = rng.choice(["UPDATE", "UPDATE", "SNAPSHOT", "DELETE"])
            events.append(obj(world, key, change, version, k=k))
            if version > model.get(key, (-1, False))[0]:
                model[key] = (version, change == "DELETE")
        out = committer.commit_batch(batch(world, f"r{k}", events, offset))
        offset += len(events)
        st = out.stats["entity_common"]
        saw_rewrite |= st.rows_rewritten > 0
        saw_merge |= st.bytes_rewritten > 0 and st.rows_rewritten == 0
        state = objects(committer.catalog(branch))
        assert {pk: (v, d) for pk, (v, d, _) in state.items()} == model, f"after flush {k}"
    assert saw_rewrite, "the policy should have compacted at least one file"
    table = committer.catalog(branch).load_table("onto.entity_common")
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    per_partition: dict[tuple, set[str]] = {}  # delete files are written and merged per partition
    for task in table.scan().plan_files():
        for df in task.delete_files:
            per_partition.setdefault(tuple(df.partition), set()).add(df.file_path)
    assert per_partition and all(len(files) <= 3 for files in per_partition.values()), per_partition


def test_unchanged_properties_keep_their_stored_values(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """A CDC update that could not send a column (TOAST) never erases its stored value."""
    from dataclasses import replace

    committer = BatchCommitter(sink_settings, client)
    committer.commit_batch(batch(world, "u1", [obj(world, "p1", "CREATE", 1, a=1, doc="big text")], 0))
    # Across batches: the value comes from the stored row.
    update = replace(obj(world, "p1", "UPDATE", 2, a=2), unchanged=("doc",))
    committer.commit_batch(batch(world, "u2", [update], 1))
    # Within one batch: from the earlier event of the same key.
    create = obj(world, "p2", "CREATE", 1, a=1, doc="other")
    same_batch = replace(obj(world, "p2", "UPDATE", 2, a=3), unchanged=("doc", "never-stored"))
    committer.commit_batch(batch(world, "u3", [create, same_batch], 2))
    state = objects(committer.catalog(f"world-{world}"))
    assert orjson.loads(state["p1"][2]) == {"a": 2, "doc": "big text"}
    assert orjson.loads(state["p2"][2]) == {"a": 3, "doc": "other"}


# --- issue 12: what a recorded offset or a stale version really means ---------------------------


def test_an_event_under_a_floor_that_its_branch_does_not_hold_is_reported_absent_not_applied(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """Case 2: E@10 was dead-lettered (cause missing) and a flush recorded floor 11; E comes back."""
    committer = BatchCommitter(sink_settings, client)
    branch = f"world-{world}"
    other = obj(world, "p11", "CREATE", 1)
    b1 = Batch.from_sources(world, "f1", [(other, Source(OBJ, 0, 11))], settled={(OBJ, 0): 11})
    committer.commit_batch(b1)
    late = obj(world, "p10", "CREATE", 1)
    out = committer.commit_batch(Batch.from_sources(world, "f2", [(late, Source(OBJ, 0, 10))]))
    assert out.absent_ids == {late.event_id}  # settled by the floor, yet not on the branch
    assert late.event_id not in event_ids(committer.catalog(branch))


def test_a_batch_found_committed_already_still_reports_its_stale_events(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """Case 3: a crash between the Nessie commit and the stale dead letter, then redelivery."""
    committer = BatchCommitter(sink_settings, client)
    newer, older = obj(world, "p1", "CREATE", 2), obj(world, "p1", "UPDATE", 1)
    committer.commit_batch(batch(world, "s1", [newer], 0))
    first = committer.commit_batch(batch(world, "s2", [older], 1))
    assert first.stale_ids == {older.event_id}
    again = committer.commit_batch(batch(world, "s2-redelivered", [older], 1))
    assert again.already_committed and again.stale_ids == {older.event_id}
    assert not again.absent_ids


def test_a_batch_whose_unknown_outcome_is_found_landed_reports_its_stale_events(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """Case 3, the other path: the commit landed but its answer was lost."""
    committer = lost_answer_on(2)(sink_settings, client)
    newer, older, fresh = obj(world, "p1", "CREATE", 2), obj(world, "p1", "UPDATE", 1), obj(world, "p2", "CREATE", 1)
    committer.commit_batch(batch(world, "l1", [newer], 0))
    out = committer.commit_batch(batch(world, "l2", [older, fresh], 1))
    assert out.already_committed and out.stale_ids == {older.event_id} and not out.absent_ids


def test_a_copy_of_an_applied_event_at_another_offset_is_a_duplicate_not_a_stale_version(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """A producer retry whose Redis mark was lost in the commit→mark window reaches the committer."""
    committer = BatchCommitter(sink_settings, client)
    branch = f"world-{world}"
    original = obj(world, "p1", "CREATE", 1, n=1)
    committer.commit_batch(batch(world, "d1", [original], 0))
    out = committer.commit_batch(batch(world, "d2", [original, obj(world, "p2", "CREATE", 1)], 7))
    assert out.duplicate_ids == {original.event_id} and not out.stale_ids
    ids = event_ids(committer.catalog(branch))
    assert ids.count(original.event_id) == 1 and len(ids) == 2


def test_truncate_then_toast_unchanged_update_in_one_batch_keeps_nothing_from_before_the_truncate(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    from dataclasses import replace

    committer = BatchCommitter(sink_settings, client)
    committer.commit_batch(batch(world, "t1", [obj(world, "k", "CREATE", 1, a=0, big="old")], 0))
    update = replace(obj(world, "k", "UPDATE", 2, a=1), unchanged=("big",))
    committer.commit_batch(batch(world, "t2", [obj(world, "*", "TRUNCATE", 0), update], 1))
    version, deleted, props = objects(committer.catalog(f"world-{world}"))["k"]
    assert (version, deleted) == (2, False) and orjson.loads(props or "{}") == {"a": 1}


def test_commit_properties_carry_exactly_the_offsets_applied_from_offset_zero(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """Issue 24 item 9: the first commit of a run (offsets from 0) listed none of the prefix."""
    committer = BatchCommitter(sink_settings, client)
    events = [obj(world, f"p{i}", "CREATE", 1) for i in range(4)] + [link(world, "l0", 1, "p0", "p1")]
    committer.commit_batch(batch(world, "z1", events, 0))
    props = next(iter(client.history(f"world-{world}", max_records=1))).items[0].properties
    assert props[f"causeway.offsets.{OBJ}/0"] == "0-3" and props[f"causeway.offsets.{LNK}/0"] == "4"
    # A redelivered offset is not applied again, so it is not listed again.
    committer.commit_batch(batch(world, "z2", [events[3], obj(world, "p9", "CREATE", 1)], 3))
    props = next(iter(client.history(f"world-{world}", max_records=1))).items[0].properties
    assert props[f"causeway.offsets.{OBJ}/0"] == "4"


def test_a_commit_reads_table_contents_once_and_builds_each_transaction_state_once(
    client: SyncNessieClient, sink_settings: Settings, world: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13 "cheaper commits": one Nessie contents call for the three tables (was 6: a load and
    a commit lookup per table), and pyiceberg's table metadata built once per transaction state
    (was rebuilt and deep-copied on every read, ~60 times per commit). After a commit by the same
    process, the next one parses no metadata file and no committed-offset map: it reads what the
    previous commit wrote, kept in memory (was: 3 metadata JSON parses and one map parse each)."""
    import sinks.committed_offsets
    import sinks.table_metadata
    from sinks.table_metadata import CACHE, BuiltOnceTransaction

    committer = BatchCommitter(sink_settings, client)
    committer.commit_batch(batch(world, "b1", [obj(world, "p", "CREATE", 1, n=1), link(world, "l", 1, "p", "q")], 0))

    calls: list[object] = []
    real_contents = client.get_contents
    monkeypatch.setattr(client, "get_contents", lambda *a, **kw: (calls.append(a), real_contents(*a, **kw))[1])
    real_with_ref = client.get_contents_and_reference
    monkeypatch.setattr(
        client, "get_contents_and_reference", lambda *a, **kw: (calls.append(a), real_with_ref(*a, **kw))[1]
    )
    built: list[tuple[BuiltOnceTransaction, object]] = []  # references, so no id is reused
    real_metadata = BuiltOnceTransaction.table_metadata

    def counting(self: BuiltOnceTransaction) -> object:
        if self._meta is None or self._meta_base is not self._table.metadata or self._meta_updates is not self._updates:
            built.append((self, self._updates))
        return real_metadata.fget(self)  # type: ignore[attr-defined]

    monkeypatch.setattr(BuiltOnceTransaction, "table_metadata", property(counting))
    real_build = sinks.table_metadata.build
    builds: list[object] = []
    monkeypatch.setattr(sinks.table_metadata, "build", lambda *a, **kw: (builds.append(a), real_build(*a, **kw))[1])
    real_loads = sinks.committed_offsets.loads_map
    parsed: list[object] = []
    monkeypatch.setattr(sinks.committed_offsets, "loads_map", lambda text: (parsed.append(text), real_loads(text))[1])
    parses = CACHE.parses
    events = [obj(world, "p", "UPDATE", 2, n=2), obj(world, "r", "CREATE", 1, n=3), link(world, "l", 2, "p", "r")]
    outcome = committer.commit_batch(batch(world, "b2", events, 2))

    assert outcome.events_appended == 3 and not outcome.already_committed
    assert len(calls) == 1
    same = [(i, j) for i, a in enumerate(built) for j, b in enumerate(built[:i]) if a[0] is b[0] and a[1] is b[1]]
    assert built and same == []  # never built twice for the same transaction state
    assert len(builds) == len(built) + 3  # and the catalog's commit builds each table's next version once
    assert CACHE.parses == parses, "a metadata file this process wrote was parsed again"
    assert parsed == [], "the committed-offset map this committer wrote was parsed again"
    assert objects(committer.catalog(f"world-{world}"))["p"][:2] == (2, False)
    # Another process's view: read back from the files, the same state.
    CACHE.clear()
    assert objects(committer.catalog(f"world-{world}"))["p"][:2] == (2, False)
    assert CACHE.parses > parses
    recorded = committer.committed_offsets(f"world-{world}")[(OBJ, 0)]
    assert [o for o in range(6) if o in recorded] == [0, 2, 3]


def test_small_flushes_that_delete_little_still_compact_their_small_files(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """A world of small flushes (a few new keys, one hot key updated) keeps its projection's file count
    bounded: the small-file merge is not starved by a rewrite budget sized to the one row it deletes."""
    settings = sink_settings.replace(projection_buckets=0)  # one partition for the one type
    committer = BatchCommitter(settings, client, max_small_files=4)
    offset = 0
    for k in range(40):
        events = [obj(world, "hot", "UPDATE" if k else "CREATE", k + 1, k=k)]
        events += [obj(world, f"p{k}-{j}", "CREATE", 1, k=k) for j in range(3)]
        committer.commit_batch(batch(world, f"s{k}", events, offset))
        offset += len(events)
    cat = committer.catalog(f"world-{world}")
    common = cat.load_table(("onto", "entity_common"))
    files = list(common.scan().plan_files())
    assert len(files) <= 20, f"{len(files)} data files after 40 small flushes: small files were never merged"
    live = objects(cat)
    assert live["hot"][0] == 40 and sum(1 for k in live if k.startswith("p")) == 120


def test_the_small_file_merge_reads_no_file_the_flushes_before_it_wrote(
    client: SyncNessieClient, sink_settings: Settings, world: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small projection files are merged a few flushes after they were written; their writer keeps
    their rows, so the merge reads none of them back (was: every merged file read from storage, the
    commit's "compaction pick + read" stage, 88 ms of a 0.68 s commit at 1,000 events/s)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    settings = sink_settings.replace(projection_buckets=0)  # one partition for the one type
    committer = BatchCommitter(settings, client, max_small_files=4)
    opened: list[str] = []
    real_new_input = PyArrowFileIO.new_input

    def recording(self: PyArrowFileIO, location: str) -> object:
        if "/entity_common" in location and "/data/" in location:
            opened.append(location)
        return real_new_input(self, location)

    monkeypatch.setattr(PyArrowFileIO, "new_input", recording)
    offset = 0
    for k in range(12):
        events = [obj(world, f"p{k}-{j}", "CREATE", 1, k=k) for j in range(3)]
        committer.commit_batch(batch(world, f"s{k}", events, offset))
        offset += len(events)
    cat = committer.catalog(f"world-{world}")
    common = cat.load_table(("onto", "entity_common"))
    assert len(list(common.scan().plan_files())) < 12  # small files were merged
    assert opened == [], f"{len(opened)} data files of the projection read back from storage"
    live = objects(cat)
    assert sorted(live) == sorted(f"p{k}-{j}" for k in range(12) for j in range(3))
    assert all(v[:2] == (1, False) for v in live.values())


def test_a_commit_makes_two_nessie_round_trips_and_reads_no_manifest_an_earlier_flush_read(
    client: SyncNessieClient, sink_settings: Settings, world: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13 "many worlds: cut c": manifests are immutable, so a flush decodes from storage only
    the manifests it did not write itself (was: every manifest of the three tables,
    once per plan and once per manifest rewrite, ~30 Avro reads per flush); and a commit makes two
    Nessie round trips: the head with its three tables' contents, then the commit (was three: the
    head, the contents, the commit; before that two ``get_reference`` calls on top)."""
    import pyiceberg.manifest

    committer = BatchCommitter(sink_settings, client)
    for n in range(4):  # several snapshots and manifests per table, deletes and removed files too
        events = [obj(world, f"p{i}", "UPDATE" if n else "CREATE", n + 1, n=n) for i in range(5)]
        committer.commit_batch(batch(world, f"b{n}", [*events, link(world, "l", n + 1, "p0", "p1")], 10 * n))

    read: list[str] = []
    real_avro_init = pyiceberg.manifest.AvroFile.__init__

    def recording(self: object, input_file: object, *a: object, **kw: object) -> None:
        read.append(input_file.location)  # type: ignore[attr-defined]
        real_avro_init(self, input_file, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(pyiceberg.manifest.AvroFile, "__init__", recording)
    sent: list[tuple[str, str]] = []
    real_send = client._send
    monkeypatch.setattr(client, "_send", lambda call: (sent.append((call.method, call.path)), real_send(call))[1])

    per_flush: list[set[str]] = []
    for n in range(4, 7):
        branch = f"world-{world}"
        head = client.get_reference(branch).hash
        read.clear()
        sent.clear()
        events = [obj(world, f"p{i}", "UPDATE", n + 1, n=n) for i in range(5)]
        committer.commit_batch(batch(world, f"b{n}", [*events, link(world, "l", n + 1, "p0", "p1")], 10 * n))
        assert sent == [("POST", f"/trees/{branch}/contents"), ("POST", f"/trees/{branch}@{head}/history/commit")]
        per_flush.append(set(read))  # manifests and manifest lists
    # Every manifest of the branch was written by this committer, which hands what it writes to
    # the manifest cache: no flush decodes any (before 2026-12-01's seeding, each decoded the ~4
    # the flush before it wrote, once).
    assert per_flush == [set(), set(), set()]
    common = objects(committer.catalog(f"world-{world}"))
    assert {k: v[:2] for k, v in common.items()} == {f"p{i}": (7, False) for i in range(5)}


def test_the_logs_compaction_lists_the_same_live_files_as_a_scan_plan(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """``logcompact.live_data_files`` (data manifests, no scan plan) lists exactly the files
    ``plan_files`` plans, through appends and a compaction that removed files."""
    from sinks.logcompact import live_data_files

    committer = BatchCommitter(sink_settings.replace(target_file_bytes=256 * 1024), client)
    for n in range(10):  # 9+ small files in one day: the log's compaction merges a tier
        committer.commit_batch(batch(world, f"b{n}", [obj(world, f"p{n}", "CREATE", 1, n=n)], n))
    events = committer.catalog(f"world-{world}").load_table((sink_settings.namespace, "entity_events"))
    planned = {t.file.file_path for t in events.scan().plan_files()}
    assert set(live_data_files(events.metadata, events.io)) == planned
    assert len(planned) < 10  # compaction removed files: deleted entries are not listed


def test_the_logs_compaction_merges_the_rows_its_flushes_kept_without_reading_them_back(
    client: SyncNessieClient, sink_settings: Settings, world: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each flush appends a small log file; the log's compaction merges them by tier. The flush
    keeps the rows it wrote (the committer's ``FileCache``), so the merge reads none of them back
    (failed before: every merged file read from storage)."""
    import sinks.committer
    import sinks.rowfiles

    read: list[str] = []
    real_read = sinks.rowfiles.read_data_file
    for module in (sinks.rowfiles, sinks.committer):  # the committer re-exports it
        monkeypatch.setattr(
            module, "read_data_file", lambda table, path: (read.append(path), real_read(table, path))[1]
        )
    committer = BatchCommitter(sink_settings.replace(target_file_bytes=256 * 1024), client)
    for n in range(10):  # 9+ small files in one day: the log's compaction merges a tier
        committer.commit_batch(batch(world, f"b{n}", [obj(world, f"p{n}", "CREATE", 1, n=n)], n))
    events = committer.catalog(f"world-{world}").load_table((sink_settings.namespace, "entity_events"))
    assert len(events.scan().plan_files()) < 10  # merged
    assert read == []
    rows = events.scan(selected_fields=("event_id", "entity_pk")).to_arrow()
    assert sorted(rows.column("entity_pk").to_pylist()) == sorted(f"p{n}" for n in range(10))


def test_a_flush_reads_none_of_the_files_the_previous_flush_wrote_and_keeps_them_exactly(
    client: SyncNessieClient, sink_settings: Settings, world: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key lookup of a flush reads the files the flush before it wrote (its data files' key
    columns, its delete files); the writer keeps what it wrote instead of reading it back (was:
    every new file read from storage by the next flush). What it keeps equals the files."""
    import pyarrow.parquet as pq

    from sinks.rowdelta import FileCache

    committer = BatchCommitter(sink_settings, client)
    missed: list[str] = []
    real_get = FileCache.get

    def recording(self: FileCache, io: object, path: str, columns: tuple[str, ...] | None, **kw: bool) -> object:
        table, hit = real_get(self, io, path, columns, **kw)  # type: ignore[arg-type]
        if not hit:
            missed.append(path)
        return table, hit

    monkeypatch.setattr(FileCache, "get", recording)
    versions = dict.fromkeys(range(40), 1)
    for n in range(6):
        missed.clear()
        keys = range(40) if n == 0 else range(n * 3, n * 3 + 4)  # few keys: delete files, not rewrites
        for i in keys:
            versions[i] += bool(n)
        events = [obj(world, f"p{i}", "UPDATE" if n else "CREATE", versions[i], n=n) for i in keys]
        outcome = committer.commit_batch(batch(world, f"b{n}", [*events, link(world, "l", n + 1, "a", "b")], 50 * n))
        assert outcome.events_appended == len(events) + 1
        if n:
            assert missed == []  # the previous flush's data and delete files were not read back
    cache = committer.file_cache
    assert cache._items and cache._split
    for (path, columns), kept in list(cache._items.items()):
        stored = pq.read_table(path.removeprefix("file://"), columns=list(columns) or None)
        assert kept.equals(stored.select(kept.column_names)) and kept.schema.names == stored.schema.names
    for path, split in list(cache._split.items()):
        stored = pq.read_table(path.removeprefix("file://"))
        assert sum(len(v) for v in split.values()) == stored.num_rows
        for data_path, pos in split.items():
            mask = pc.equal(stored.column("file_path"), data_path)
            assert stored.column("pos").filter(mask).to_pylist() == pos.to_pylist()
    assert {k: v[:2] for k, v in objects(committer.catalog(f"world-{world}")).items()} == {
        f"p{i}": (v, False) for i, v in versions.items()
    }
    # The key lookup's plan (cached manifests, pyiceberg's delete index) is the scan's plan.
    from sinks.rowdelta import plan_live_files

    common = committer.catalog(f"world-{world}").load_table((sink_settings.namespace, "entity_common"))
    planned = {(t.file.file_path, frozenset(d.file_path for d in t.delete_files)) for t in common.scan().plan_files()}
    assert any(deletes for _, deletes in planned)
    assert {
        (t.file.file_path, frozenset(d.file_path for d in t.delete_files)) for t in plan_live_files(common)
    } == planned


def _looked_up_once(
    client: SyncNessieClient, sink_settings: Settings, world: str, rows_per_file: int
) -> tuple[BatchCommitter, list[str], list[Any]]:
    """Three log files of ``rows_per_file`` rows, then a restarted worker's (nothing cached) first
    lookup of two logged ids and an absent one: the reader, those ids, the log's files."""
    writer = BatchCommitter(sink_settings, client)
    offset = 0
    for k in range(3):
        events = [obj(world, f"p{k}-{j}", "CREATE", 1) for j in range(rows_per_file)]
        writer.commit_batch(batch(world, f"b{k}", events, offset))
        offset += len(events)
    some = sorted(event_ids(writer.catalog(f"world-{world}")))[:2]
    reader = BatchCommitter(sink_settings, client)
    assert reader.applied_events(world, {*some, "never-published"}) == set(some)
    log = reader.catalog(f"world-{world}").load_table(("onto", "entity_events"))
    files = [t.file for t in log.scan().plan_files()]
    assert len(files) == 3
    return reader, some, files


@contextmanager
def _gone_from_storage(files: list[Any]) -> Iterator[None]:
    """The files moved away for the block (only a read would notice), then back."""
    paths = [f.file_path.removeprefix("file://") for f in files]
    for p in paths:
        os.rename(p, p + ".gone")
    try:
        yield
    finally:
        for p in paths:
            os.rename(p + ".gone", p)


def test_a_small_log_file_is_read_from_storage_once_for_its_lookups(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """A log file of fewer than keyfilter.MIN_ROWS rows gets no key filter, so every lookup reads
    it; a worker that did not write it (restarted, or its rows evicted) read it from storage on
    every cause lookup. Now its two columns are kept in the file cache after the first read: here
    the files are gone from storage after the first lookup, and the second is still answered."""
    reader, some, files = _looked_up_once(client, sink_settings, world, 40)
    assert all(f.record_count < MIN_ROWS for f in files)
    with _gone_from_storage(files):
        assert reader.applied_events(world, {some[1], "absent"}) == {some[1]}


def test_a_lookup_of_ids_the_log_does_not_hold_reads_no_log_file_once_their_filters_are_built(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """The applier looks up causes Redis has no mark for, most of them not applied (not arrived
    yet): a pyiceberg ``In`` scan read every log file each time, so the lookups grew with the log
    (a third of the worker's CPU in a 5,000/s soak). Now each log file's ``event_id`` filter is kept
    after its first read, and ids no file holds are answered without opening a file: here the
    files are gone from storage after the first lookup, which only a read would notice."""
    reader, some, files = _looked_up_once(client, sink_settings, world, 2100)  # > MIN_ROWS: filtered
    filters = [reader.file_cache.key_filter(f.file_path, "event_id") for f in files]
    assert all(k is not None for k in filters)  # built by the first lookup
    # A filter answers "maybe" for a few absent ids (its false positives, ~10^-4 each): those are
    # read, as they must be. The ids asked here are the absent ones every file's filter rules out.
    absent = [
        i
        for i in (f"absent-{n}" for n in range(600))
        if not any(k is not None and k.may_hold(Probe.of(pa.array([i], pa.string()))) for k in filters)
    ][:500]
    assert len(absent) == 500
    with _gone_from_storage(files):
        assert reader.applied_events(world, set(absent)) == set()
        with pytest.raises(TableUnreadable):  # an id the log holds is still read from its file
            reader.applied_events(world, {some[0]})


def test_a_log_file_the_merge_writes_for_good_has_its_filter_before_any_lookup(
    client: SyncNessieClient, sink_settings: Settings, world: str
) -> None:
    """The log's merge writes the files that are never merged again with the rows in hand, and now
    keeps their ``event_id`` filter then, on the spill's disk. Before, a merged file had none until
    a lookup read it whole: a soak that fell behind looked causes up after every merge (its first lookup, no file
    filtered, took 28 s). Here the merged file is gone from storage after the merge, and a lookup
    of absent ids is still answered (failed before: it had to read the file)."""
    writer = BatchCommitter(sink_settings.replace(log_merge_max_rows=8_000), client)
    for k in range(9):  # 600-row flush files (no filter: < MIN_ROWS); eight of a tier merge into one
        events = [obj(world, f"p{k}-{j}", "CREATE", 1) for j in range(600)]
        writer.commit_batch(batch(world, f"b{k}", events, 600 * k))
    log = writer.catalog(f"world-{world}").load_table((sink_settings.namespace, "entity_events"))
    files = [t.file for t in log.scan().plan_files()]
    merged = [f for f in files if f.record_count >= 4_000]  # done at half the merge bound: final
    assert len(merged) == 1 and len(files) < 9
    key = (merged[0].file_path, "event_id")
    assert writer.file_cache.spill is not None and key in writer.file_cache.spill  # on disk,
    assert key not in writer.file_cache._filters  # not in memory until a lookup asks for it
    kept = writer.file_cache.key_filter(*key)
    assert kept is not None
    absent = [i for i in (f"absent-{n}" for n in range(300)) if not kept.may_hold(Probe.of(pa.array([i])))][:200]
    with _gone_from_storage(merged):
        assert writer.applied_events(world, set(absent)) == set()


def test_a_retry_after_another_writers_commit_takes_the_files_its_failed_attempt_wrote(
    client: SyncNessieClient, sink_settings: Settings, world: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sinks.committer
    import sinks.projection_write

    branch = f"world-{world}"
    BatchCommitter(sink_settings, client).commit_batch(batch(world, "seed", [obj(world, "p", "CREATE", 1)], 0))
    steps: list[str] = []
    for module, name in ((sinks.projection_write, "write_split"), (sinks.committer, "write_data_files_with_rows")):
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _real=real, _name=name, **k: (steps.append(_name), _real(*a, **k))[1]
        )

    def race(rival_events: list[Any], rival_offset: int, loser_events: list[Any], loser_offset: int, tag: str) -> Any:
        # The rival stages its commit (its snapshot's time) before the loser starts, and publishes
        # while the loser stages against the old head: the loser's first attempt conflicts.
        staged, publish = threading.Event(), threading.Event()

        def rival_waits(cat: NessieCatalog, b: Batch, attempt: int) -> None:
            staged.set()
            assert publish.wait(30)

        rival = BatchCommitter(sink_settings, client, before_publish=rival_waits)
        rival_thread = threading.Thread(
            target=rival.commit_batch, args=(batch(world, f"rival-{tag}", rival_events, rival_offset),)
        )
        rival_thread.start()
        assert staged.wait(30)
        time.sleep(0.01)  # the loser's batch starts after the rival's snapshot time

        def rival_lands_first(cat: NessieCatalog, b: Batch, attempt: int) -> None:
            steps.append(f"publish {attempt}")
            if attempt == 1:
                publish.set()
                rival_thread.join(30)
                steps.append("rival done")

        loser = BatchCommitter(sink_settings, client, before_publish=rival_lands_first)
        return loser.commit_batch(batch(world, tag, loser_events, loser_offset))

    # The rival's commit touches another key: the retry writes the same rows, from the same files.
    out = race(
        [obj(world, "r", "CREATE", 1)], 100, [obj(world, "q", "CREATE", 1), obj(world, "p", "UPDATE", 2, n=2)], 50, "l1"
    )
    assert out.attempts == 2 and not out.already_committed
    retry = steps[steps.index("rival done") + 1 :]
    assert retry == ["publish 2"], steps
    cat = BatchCommitter(sink_settings, client).catalog(branch)
    assert objects(cat) == {"p": (2, False, '{"n":2}'), "q": (1, False, "{}"), "r": (1, False, "{}")}
    ids = event_ids(cat)
    assert len(ids) == len(set(ids)) == 4

    # The rival's commit makes the batch's update of p stale: the retry's rows differ, written anew.
    steps.clear()
    out = race([obj(world, "p", "UPDATE", 5, n=5)], 200, [obj(world, "p", "UPDATE", 3, n=3)], 60, "l2")
    assert out.attempts == 2 and out.events_stale == 1
    retry = steps[steps.index("rival done") + 1 :]
    assert retry == ["write_data_files_with_rows", "publish 2"], steps  # no projection row to write now
    cat = BatchCommitter(sink_settings, client).catalog(branch)
    assert objects(cat)["p"] == (5, False, '{"n":5}')
    log = cat.load_table("onto.entity_events").scan().to_arrow()
    assert log.num_rows == 6 and pc.sum(pc.invert(log.column("applied"))).as_py() == 1


def test_a_retry_after_a_rival_that_landed_later_than_the_batch_began_stamps_its_rows_after_the_rivals(
    client: SyncNessieClient, sink_settings: Settings, world: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The log's readers fold it in committed_at order (a TRUNCATE drops its type's older keys), so
    # a commit that lands after another must not carry an older committed_at. Failed before: the
    # retry kept the batch's first time, older than the rival's rows, and reused its files.
    import sinks.committer

    branch = f"world-{world}"
    BatchCommitter(sink_settings, client).commit_batch(batch(world, "seed", [obj(world, "p", "CREATE", 1)], 0))
    rival = BatchCommitter(sink_settings, client)
    writes: list[str] = []
    real = sinks.committer.write_data_files_with_rows
    monkeypatch.setattr(
        sinks.committer, "write_data_files_with_rows", lambda *a, **k: (writes.append("log"), real(*a, **k))[1]
    )

    def rival_commits_now(cat: NessieCatalog, b: Batch, attempt: int) -> None:
        if attempt == 1:  # after the loser's batch began: the rival's rows are newer than its first time
            time.sleep(0.01)
            rival.commit_batch(batch(world, "rival", [obj(world, "r", "CREATE", 1)], 100))

    loser = BatchCommitter(sink_settings, client, before_publish=rival_commits_now)
    out = loser.commit_batch(batch(world, "late", [obj(world, "q", "CREATE", 1)], 50))
    assert out.attempts == 2
    assert writes.count("log") == 3  # the loser's two attempts wrote their own rows (and the rival once)
    log = BatchCommitter(sink_settings, client).catalog(branch).load_table("onto.entity_events").scan().to_arrow()
    at = {row["entity_pk"]: row["committed_at"] for row in log.to_pylist()}
    assert at["q"] > at["r"] > at["p"]
