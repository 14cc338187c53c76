"""Exactly-once in narrow interleavings (issue 12): the applier with the real committer and Nessie.

Redis marks and the dead-letter topic are in-memory stand-ins that survive a simulated crash (a
new ``Applier`` on the same branch, marks and letters, the Kafka offsets never committed); the
branch is the real one, so what the committer reads back is what decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest

from agents.applier import RawRecord
from sinks.committer import BatchCommitter
from sinks.nessie import SyncNessieClient
from sinks.readback import read_world
from sinks.tables import TRUNCATED_PROPERTY
from streams.settings import Settings
from tests.fakes import FakeMarks as Marks
from tests.integration.applier_setup import OBJ, Clock, Crash, Dlq, applier, rec

pytestmark = pytest.mark.integration


async def test_a_dead_lettered_event_redelivered_under_a_floor_is_not_marked_applied(
    world: str, eo_settings: Settings
) -> None:
    """Case 2: E@10 times out → DLQ; a flush records floor 11; crash before the offset commit; E's
    cause arrives; E is redelivered, released and dropped by the floor. It must not be marked
    applied (a redrive would be skipped) and must not release its effects."""
    marks, dlq, clock = Marks(), Dlq(), Clock()
    first = applier(eo_settings, marks, dlq, clock)
    await first.process([rec(world, 10, "E", "e", caused_by="C")])
    clock.now += 10
    await first.tick()
    assert [d.reason for d in dlq.letters] == ["cause-missing"]
    await first.process([rec(world, 11, "X", "x")])  # its flush records floor 11 on the branch
    # kill -9: Kafka never got offset 10 or 11; a new worker reads them again after C arrived.
    second = applier(eo_settings, marks, dlq, clock)
    await second.process([rec(world, 0, "C", "c", partition=1)])
    await second.process([rec(world, 10, "E", "e", caused_by="C"), rec(world, 11, "X", "x")])
    await second.process([rec(world, 12, "F", "f", caused_by="E")])
    assert (world, "E") not in marks.marked
    assert second.gate.is_parked((world, "F"))  # E never took effect: F waits for it
    assert set(read_world(eo_settings, world).event_ids) == {"X", "C"}


async def test_stale_events_of_a_batch_found_committed_after_a_crash_are_dead_lettered(
    world: str, eo_settings: Settings
) -> None:
    """Case 3: the commit landed, the worker died before the stale dead letter; redelivery."""
    marks, dlq, clock = Marks(), Dlq(), Clock()
    first = applier(eo_settings, marks, dlq, clock)
    await first.process([rec(world, 0, "N", "p", version=2)])
    dlq.crash_next = True
    with pytest.raises(Crash):
        await first.process([rec(world, 1, "O", "p", version=1)])
    assert not dlq.letters
    second = applier(eo_settings, marks, dlq, clock)
    acks = await second.process([rec(world, 1, "O", "p", version=1)])
    assert [(d.reason, d.event_id) for d in dlq.letters] == [("stale-version", "O")]
    assert acks == ["h1"]


async def test_a_producer_retry_of_an_applied_event_with_its_mark_lost_is_a_duplicate(
    world: str, eo_settings: Settings
) -> None:
    """A copy at another offset, its mark lost in the commit→mark window: not `stale-version`."""
    marks, dlq, clock = Marks(), Dlq(), Clock()
    first = applier(eo_settings, marks, dlq, clock)
    await first.process([rec(world, 0, "A", "p")])
    marks.marked.clear()  # the crash came between the Nessie commit and the marks
    second = applier(eo_settings, marks, dlq, clock)
    acks = await second.process([rec(world, 5, "A", "p")])
    assert not dlq.letters
    assert acks == ["h5"] and second.totals["duplicates"] == 1
    assert (world, "A") in marks.marked
    assert read_world(eo_settings, world).event_ids["A"] == 1


@pytest.mark.parametrize("branch", ["recorded", "written-before-the-property", "written-before-the-ceilings"])
async def test_a_copy_of_an_applied_event_after_a_truncate_of_its_type_with_its_mark_lost_is_a_duplicate(
    branch: str, world: str, eo_settings: Settings
) -> None:
    """Mark repair depth, the TRUNCATE case: A landed, then a TRUNCATE of its type removed A's key
    and its version; A's mark is gone (Redis lost it, or it aged out of the window). A copy of A at
    another offset passes the version rule (no stored version left to be older than); before, it was
    applied a second time. Now a branch records the types it truncated, and events of those types
    are looked up by id in the log before they are written: the copy is a duplicate. A branch
    written before the property existed reads its TRUNCATEs from the log once; one written while
    it listed the types without their version ceilings reads the ceilings from the log once."""
    marks, dlq, clock = Marks(), Dlq(), Clock()
    first = applier(eo_settings, marks, dlq, clock)
    await first.process([rec(world, 0, "A", "p")])
    await first.process([RawRecord(OBJ, 0, 1, f"{world}::*".encode(), _truncate(world), [], "h1")])
    assert read_world(eo_settings, world).event_ids == {"A": 1, "TR": 1}
    if branch != "recorded":  # as a branch truncated before the property existed: the log tells
        committer = first.committer
        assert isinstance(committer, BatchCommitter)
        cat = committer.catalog(committer.naming.branch(world))
        cat.begin()
        table = cat.load_table((eo_settings.namespace, "entity_events"))
        if branch == "written-before-the-property":
            table.transaction().remove_properties(TRUNCATED_PROPERTY).commit_transaction()
        else:
            table.transaction().set_properties({TRUNCATED_PROPERTY: '["object/T"]'}).commit_transaction()
        cat.publish("test: the truncated-types property as an older branch has it")
    marks.marked.clear()
    second = applier(eo_settings, marks, dlq, clock)
    acks = await second.process([rec(world, 5, "A", "p"), rec(world, 6, "B", "q")])
    assert not dlq.letters and acks == ["h5", "h6"] and second.totals["duplicates"] == 1
    assert read_world(eo_settings, world).event_ids == {"A": 1, "TR": 1, "B": 1}
    assert (world, "A") in marks.marked


async def test_a_copy_of_an_event_a_truncate_hid_is_a_duplicate_even_once_its_key_is_re_created_lower(
    world: str, eo_settings: Settings
) -> None:
    """After a TRUNCATE a type may start again at any version: A (version 5) landed, the truncate
    removed it, R re-created A's key at version 1, and A's mark is gone. A's copy is above R's
    version, so the version rule takes it: a present row does not clear an event, only the type's
    version ceiling (5, what the truncate removed) does. B (version 2, above R, not in the log) is
    an ordinary update of the re-created key and is applied."""
    marks, dlq, clock = Marks(), Dlq(), Clock()
    first = applier(eo_settings, marks, dlq, clock)
    await first.process([rec(world, 0, "A", "p", version=5)])
    await first.process([RawRecord(OBJ, 0, 1, f"{world}::*".encode(), _truncate(world), [], "h1")])
    await first.process([rec(world, 2, "R", "p", version=1)])
    marks.marked.clear()
    second = applier(eo_settings, marks, dlq, clock)
    acks = await second.process([rec(world, 7, "A", "p", version=5), rec(world, 8, "B", "p", version=2)])
    assert not dlq.letters and acks == ["h7", "h8"] and second.totals["duplicates"] == 1
    state = read_world(eo_settings, world)
    assert state.event_ids == {"A": 1, "TR": 1, "R": 1, "B": 1}
    assert state.objects["p"]["version"] == 2


def test_updates_of_live_keys_of_a_truncated_type_above_its_ceiling_read_no_log(
    world: str, eo_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TRUNCATE duplicate check's cost: after a truncate of T, every later batch of T looked
    each of its event ids up in the log, for good (a scan that grows with the log). Only events at
    or below the version ceiling (the highest version the truncate removed) can be copies of what
    it hid: a batch of updates above it reads nothing; one key re-created at a restarted version
    still is looked up."""
    import sinks.committer as committer_module
    from sinks.committer import Batch
    from tests.integration.commits import obj

    looked_up: list[set[str]] = []
    logged = committer_module.logged_events

    def counting(table: object, ids: set[str], cache: object = None) -> dict[str, bool]:
        if ids:
            looked_up.append(set(ids))
        return logged(table, ids, cache)  # type: ignore[arg-type]

    monkeypatch.setattr(committer_module, "logged_events", counting)
    committer = BatchCommitter(eo_settings)
    keys = [f"k{i}" for i in range(10)]
    committer.commit_batch(Batch(world, "seed", [obj(world, k, "CREATE", 5, typ="T") for k in keys]))
    committer.commit_batch(Batch(world, "truncate", [obj(world, "*", "TRUNCATE", 1, typ="T")]))
    reload = [obj(world, k, "CREATE", 6, typ="T") for k in keys] + [obj(world, "x", "CREATE", 1, typ="T")]
    committer.commit_batch(Batch(world, "reload", reload))
    looked_up.clear()
    updates = [obj(world, k, "UPDATE", 7, typ="T") for k in keys]
    restarted = obj(world, "x", "UPDATE", 2, typ="T")  # at or below the ceiling (5)
    out = committer.commit_batch(Batch(world, "updates", [*updates, restarted]))
    assert out.events_appended == 11 and not out.duplicate_ids
    assert looked_up == [{restarted.event_id}]  # before: all 11 ids


@pytest.mark.parametrize("how", ["mark-lost", "fork"])
async def test_a_cause_applied_on_the_branch_but_unknown_to_redis_releases_its_effect(
    how: str, world: str, eo_settings: Settings, client: SyncNessieClient
) -> None:
    """Case 5: the cause's mark expired or was lost, or the effect's world is a fork made after the
    cause landed (a fork inherits history, not marks): the log decides."""
    marks, dlq, clock = Marks(), Dlq(), Clock()
    first = applier(eo_settings, marks, dlq, clock)
    await first.process([rec(world, 0, "C", "c")])
    target = world
    if how == "mark-lost":
        marks.marked.clear()  # TTL expiry or Redis data loss
    else:
        target = f"{world}f"
        client.create_branch(f"world-{target}", client.get_reference(f"world-{world}"))
    second = applier(eo_settings, marks, dlq, clock)
    await second.process([rec(target, 1, "E", "e", caused_by="C")])
    assert second.gate.is_parked((target, "E"))
    clock.now += 1.5  # past the lookup grace, far from the causal timeout
    # The tick starts the branch lookup beside the intake (agents/applier.py ``_look_up_causes``);
    # what it finds is learned when it lands and released by the next tick.
    acks = await second.tick()
    await second.causes_looked_up(clock.now)
    acks += await second.tick()
    assert not dlq.letters and acks == ["h1"]
    assert (target, "C") in marks.marked  # the mark is repaired
    assert set(read_world(eo_settings, target).event_ids) == {"C", "E"}


async def test_a_near_limit_bad_record_is_dead_lettered_without_its_value_and_the_worker_goes_on(
    unique: str, tmp_path: Path
) -> None:
    """Oversized dead letters: the record fits the topic, the record plus our headers does not."""
    from tests.integration.pipeline import Pipeline

    pipe = await Pipeline.create(unique, tmp_path, batch_max_seconds=0.2)
    try:
        huge = b"{" + b"x" * 1_047_700  # malformed JSON just under the broker's 1 MB record limit
        await pipe.publish_raw(pipe.settings.objects_topic, b"prod::big", huge, [("trace", b"t" * 700)])
        good = {
            "event_id": f"g-{unique}",
            "world_id": "prod",
            "object_type": "T",
            "object_pk": "g",
            "change_type": "CREATE",
            "after_properties": {},
            "version": 1,
            "occurred_at": 0,
        }
        await pipe.publish_raw(pipe.settings.objects_topic, b"prod::g", orjson.dumps(good), [])
        pipe.start_worker()
        await pipe.wait_drained(timeout=120)  # today: the DLQ publish is refused forever, nothing drains
        [letter] = await pipe.dead_letters()
        assert letter.reason == "malformed-json" and letter.value is None
        assert "omitted" in letter.detail and f"{pipe.settings.objects_topic}/" in letter.detail
        assert f"g-{unique}" in pipe.state("prod").event_ids
    finally:
        pipe.stop_all()


def test_a_live_commit_between_the_replays_two_reads_does_not_commit_an_event_twice(
    world: str, eo_settings: Settings
) -> None:
    """Replay race: the replay read the log, then a live worker committed E, then the replay read the
    recorded offsets: E looked recorded-but-absent and was committed a second time."""
    from ops.replay.run import ReplayCommitter
    from sinks.committer import Batch, Source
    from tests.integration.commits import obj

    live = BatchCommitter(eo_settings)
    e = obj(world, "p1", "CREATE", 1)
    item = [(e, Source(OBJ, 0, 4))]

    class Racing(ReplayCommitter):
        def event_ids_in_log(self, branch: str, ids: Sequence[str]) -> set[str]:
            present = super().event_ids_in_log(branch, ids)
            live.commit_batch(Batch.from_sources(world, "live-1", item))  # lands between the reads
            return present

    Racing(BatchCommitter(eo_settings)).commit_batch(Batch.from_sources(world, "replay-1", item))
    assert read_world(eo_settings, world).event_ids[e.event_id] == 1


def _truncate(world: str) -> bytes:
    """The wire record of ``TR``, a TRUNCATE of object type T."""
    doc = {
        "event_id": "TR",
        "world_id": world,
        "object_type": "T",
        "change_type": "TRUNCATE",
        "version": 1,
        "occurred_at": 0,
    }
    return orjson.dumps(doc)
