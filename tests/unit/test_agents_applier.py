"""The applier's orchestration with in-memory stand-ins for Redis, the committer and the DLQ."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agents.applier import Applier, RawRecord
from agents.readtime import ReadTime
from models.deadletter import H_FIRST_SEEN, H_REDRIVE, DeadLetter
from sinks.committer import Batch, CommitOutcome
from streams.settings import Settings
from tests.fakes import FakeCommitter, FakeMarks, FakeWorlds, applier_with, event, make, rec

OBJECTS = "onto.changes.objects"


async def test_good_bad_and_waiting_events_ack_in_offset_order() -> None:
    applier, committer, dlq, marks = make()
    acks = await applier.process(
        [
            rec(0, event(0)),
            rec(1, b"{broken", key=b"prod::x"),
            rec(2, event(2, caused_by="e9")),  # waits for e9
            rec(3, event(3)),
        ]
    )
    # e0 and e3 committed, the bad record dead-lettered, e2 parked: offset 2 holds the partition.
    assert [e.event_id for b in committer.batches for e in b.events] == ["e0", "e3"]
    assert [d.reason for d in dlq.letters] == ["malformed-json"]
    assert acks == ["h0", "h1"]
    assert marks.marked == {("prod", "e0"), ("prod", "e3")}
    acks = await applier.process([rec(4, event(9))])
    acks += await applier.tick()
    # The cause commits first; its effect follows in the same or a later commit, never before.
    order = [e.event_id for b in committer.batches for e in b.events]
    assert order.index("e9") < order.index("e2")
    assert acks == ["h2", "h3", "h4"]


async def test_a_redriven_record_that_fails_again_keeps_its_history() -> None:
    applier, _, dlq, _ = make()
    headers = [(H_REDRIVE, b"2"), (H_FIRST_SEEN, b"123"), ("trace", b"t")]
    await applier.process([rec(0, b"[1]", key=b"prod::x", headers=headers)])
    [letter] = dlq.letters
    assert (letter.redrive_count, letter.first_seen_ms) == (2, 123)
    assert ("trace", b"t") in letter.original_headers


async def test_unknown_world_is_dead_lettered_with_a_hint() -> None:
    applier, committer, dlq, _ = make()
    await applier.process([rec(0, event(1, world="nowhere"))])
    assert not committer.batches
    assert dlq.letters[0].reason == "unknown-world"
    assert "causeway worlds create nowhere" in dlq.letters[0].detail


async def test_oldest_in_flight_age_is_the_batch_real_age_not_the_flush_interval() -> None:
    # A batch that has not flushed for 400 s must show 400 s, not the 10 s flush interval (which would
    # hide a stuck batch from the stale alert and the "oldest in-flight" panel).
    now = [100.0]
    applier, _, _, _ = make()
    applier.settings = applier.settings.replace(batch_max_seconds=10.0, batch_max_events=100)
    applier.batches.max_seconds = 10.0
    applier.clock = lambda: now[0]
    await applier.process([rec(0, event(0))])
    now[0] = 500.0
    applier._export_gauges()  # what tick() exports; the flush itself is what is stuck here
    oldest = applier.metrics.registry.get_sample_value("causeway_inflight_oldest_timestamp_seconds", {"world": "prod"})
    assert oldest is not None
    assert 395 <= time.time() - oldest <= 420


async def test_a_parked_event_is_re_read_after_a_revoke_despite_a_late_old_generation_record() -> None:
    """Issue 12 case 1, through the applier: the late record must not push the partition's floor past 10."""
    applier, committer, _, _ = make()
    tp = ("onto.changes.objects", 0)
    await applier.process([rec(10, event(10, caused_by="e99")), rec(11, event(11))])  # 10 parked, 11 committed
    await applier.revoke([tp])
    await applier.process([rec(12, event(12))])  # handed out from the old generation's buffer, too late
    applier.on_assigned()
    await applier.process([rec(10, event(10, caused_by="e99")), rec(11, event(11)), rec(12, event(12))])
    assert applier.gate.is_parked(("prod", "e10"))  # back in the gate, waiting for its cause
    other = RawRecord("onto.changes.objects", 1, 0, b"prod::p50", event(50), [], "x0")
    await applier.process([other])  # a later flush records the floors
    assert committer.batches[-1].settled.get(tp, 0) <= 10


async def test_events_of_a_world_deleted_in_flight_are_not_pending_when_redriven() -> None:
    """Issue 12 case 4: the deleted-world dead letter must not leave the event pending in the gate."""
    from sinks.errors import NessieNotFound

    applier, committer, dlq, marks = make()
    real_commit = committer.commit_batch_async
    calls = []

    async def commit_once_gone(batch: Batch) -> CommitOutcome:
        calls.append(batch)
        if len(calls) == 1:
            raise NessieNotFound("branch world-prod not found")
        return await real_commit(batch)

    committer.commit_batch_async = commit_once_gone  # type: ignore[method-assign]
    await applier.process([rec(0, event(1))])
    assert [d.reason for d in dlq.letters] == ["unknown-world"]
    # An effect of e1 must wait (e1 never took effect); the redriven copy of e1 is new, not a duplicate.
    await applier.process([rec(1, event(2, caused_by="e1"))])
    assert applier.gate.is_parked(("prod", "e2"))
    await applier.process([rec(2, event(1))])
    assert [e.event_id for b in committer.batches for e in b.events] == ["e1", "e2"]
    assert marks.marked == {("prod", "e1"), ("prod", "e2")}


async def test_a_batch_that_fails_to_commit_every_time_dead_letters_only_the_poison_event() -> None:
    """Deterministic commit failures: bounded retries, then the batch is halved until the event that
    cannot be committed is alone; it and the effects it released are dead-lettered, the rest lands."""
    import asyncio

    applier, committer, dlq, marks = make()
    real_commit = committer.commit_batch_async

    async def refuse_poison(batch: Batch) -> CommitOutcome:
        if any(e.event_id == "e1" for e in batch.events):
            raise ValueError("cannot cast property 'n' to int")
        return await real_commit(batch)

    committer.commit_batch_async = refuse_poison  # type: ignore[method-assign]
    records = [rec(0, event(0)), rec(1, event(1)), rec(2, event(2, caused_by="e1")), rec(3, event(3))]
    acks = await asyncio.wait_for(applier.process(records), timeout=30)  # today: retried forever
    assert sorted(e.event_id for b in committer.batches for e in b.events) == ["e0", "e3"]
    assert sorted((d.event_id, d.reason) for d in dlq.letters) == [("e1", "commit-failed"), ("e2", "cause-missing")]
    assert "ValueError" in dlq.letters[0].detail
    assert acks == ["h0", "h1", "h2", "h3"]
    assert ("prod", "e1") not in marks.marked


def test_a_dead_letter_too_big_for_the_topic_goes_without_its_value() -> None:
    from agents.deadletter_publisher import MAX_LETTER_BYTES, fit, letter_size

    small = DeadLetter("malformed-json", "bad", "t", 0, 5, b"k", b"{")
    assert fit(small) is small
    big = DeadLetter("malformed-json", "bad", "t", 0, 5, b"k", b"{" * MAX_LETTER_BYTES, original_headers=[("h", b"v")])
    out = fit(big)
    assert out.value is None and out.original_headers == [("h", b"v")] and out.key == b"k"
    assert letter_size(out) <= MAX_LETTER_BYTES
    assert "omitted" in out.detail and "t/0@5" in out.detail
    headers = [("h", b"v" * MAX_LETTER_BYTES)]
    worst = fit(DeadLetter("r", "d" * 2000, "t", 0, 5, b"k" * MAX_LETTER_BYTES, b"x", original_headers=headers))
    assert letter_size(worst) <= MAX_LETTER_BYTES and len(worst.detail) <= 1000


def fail_first(committer: FakeCommitter, exc: Exception) -> None:
    """The committer's first call raises ``exc``; the next ones commit."""
    real_commit, failures = committer.commit_batch_async, [exc]

    async def flaky(batch: Batch) -> CommitOutcome:
        if failures:
            raise failures.pop()
        return await real_commit(batch)

    committer.commit_batch_async = flaky  # type: ignore[method-assign]


async def test_a_failing_commit_to_a_world_named_redis_marks_nessie_down_not_redis() -> None:
    """The dependency gauge follows the service a call talks to, never words in its description."""
    from sinks.errors import NessieUnavailable

    applier, committer, _, _ = make()

    async def exists(world_id: str) -> bool:
        return True

    applier.worlds.exists = exists  # type: ignore[attr-defined]
    calls: list[tuple[str, bool]] = []
    record = applier.metrics.dependency
    applier.metrics.dependency = lambda name, up: (calls.append((name, up)), record(name, up))[1]  # type: ignore[method-assign]
    fail_first(committer, NessieUnavailable("Nessie 503"))
    acks = await applier.process([rec(0, event(1, world="redis-sessions"))])
    assert acks == ["h0"]
    assert ("nessie", False) in calls
    assert ("redis", False) not in calls  # before: the word "redis" in the world id blamed Redis


async def test_an_exhausted_commit_is_counted_by_type_whatever_the_subclass() -> None:
    from sinks.errors import RetriesExhausted

    class MergeGaveUp(RetriesExhausted):
        pass

    applier, committer, _, _ = make()
    seen: list[bool] = []
    record = applier.metrics.commit_failed

    def commit_failed(world: str, *, duration_s: float, retries_exhausted: bool) -> None:
        seen.append(retries_exhausted)
        record(world, duration_s=duration_s, retries_exhausted=retries_exhausted)

    applier.metrics.commit_failed = commit_failed  # type: ignore[method-assign]
    fail_first(committer, MergeGaveUp("gave up after 9 attempts"))
    assert await applier.process([rec(0, event(1))]) == ["h0"]
    assert seen == [True]  # before: the class-name check saw "MergeGaveUp" and counted a plain failure


async def test_a_world_whose_files_are_missing_is_dead_lettered_and_other_worlds_flow() -> None:
    """A world whose branch points at deleted metadata: its events go to the DLQ (world-unreadable,
    the path in the detail), never marked; the other world lands. Before: FileNotFoundError is an
    OSError, retried as an outage until give-up, holding every world (here: the timeout)."""
    import asyncio

    from sinks.errors import TableUnreadable

    applier, committer, dlq, marks = make()
    real_commit = committer.commit_batch_async
    gone = "file:///wh/broken/metadata/00001.metadata.json"
    attempts: list[str] = []

    async def unreadable_broken(batch: Batch) -> CommitOutcome:
        attempts.append(batch.world_id)
        if batch.world_id == "broken":
            raise TableUnreadable(f"metadata file missing: {gone}", path=gone)
        return await real_commit(batch)

    async def recent_ids(world: str) -> list[str]:
        if world == "broken":  # mark repair reads the branch first (sinks.readback translates)
            raise TableUnreadable(f"{gone}: file missing", path=gone)
        return []

    class TwoWorlds(FakeWorlds):
        async def exists(self, world_id: str) -> bool:
            return world_id in ("prod", "broken")

    committer.commit_batch_async = unreadable_broken  # type: ignore[method-assign]
    applier._recent_event_ids = recent_ids
    applier.worlds = TwoWorlds()
    records = [rec(0, event(0, "broken")), rec(1, event(1)), rec(2, event(2, "broken", caused_by="e0"))]
    acks = await asyncio.wait_for(applier.process(records), timeout=10)
    assert [e.event_id for b in committer.batches for e in b.events] == ["e1"]
    # e2 was released behind e0 into the same batch: the same world, the same reason.
    assert sorted((d.event_id, d.reason) for d in dlq.letters) == [
        ("e0", "world-unreadable"),
        ("e2", "world-unreadable"),
    ]
    assert gone in next(d.detail for d in dlq.letters if d.event_id == "e0")
    assert marks.marked == {("prod", "e1")}
    assert acks == ["h0", "h1", "h2"]
    # Known unreadable: the next batch costs one attempt, not commit_failure_attempts with backoff.
    before = attempts.count("broken")
    await asyncio.wait_for(applier.process([rec(3, event(3, "broken"))]), timeout=10)
    assert attempts.count("broken") == before + 1
    assert [d.reason for d in dlq.letters if d.event_id == "e3"] == ["world-unreadable"]
    assert ("broken", "e3") not in marks.marked


class Fence:
    """Stands in for the intake's membership fence: answers ``ok`` and records each call."""

    def __init__(self, ok: bool) -> None:
        self.ok = ok
        self.calls: list[set[tuple[str, int]]] = []

    async def __call__(self, tps: Any) -> bool:
        self.calls.append(set(tps))
        return self.ok


async def test_a_zombie_whose_membership_fence_is_refused_does_not_dead_letter_its_expired_wait() -> None:
    """Issue 12, the zombie dead letter: a worker whose group membership is gone must not decide
    ``cause-missing`` on its timer (the partition's next owner may apply the event once its cause
    arrives). The fence is refused: no letter, the event is forgotten with its partition (not
    acked, not done), and the partition's records are taken again once it is assigned again."""
    applier, committer, dlq, _ = make()
    now = [100.0]
    applier.clock = lambda: now[0]
    applier.fence = fence = Fence(ok=False)
    tp = ("onto.changes.objects", 0)
    acks = await applier.process([rec(0, event(0, caused_by="e9")), rec(1, event(1))])
    assert acks == []  # offset 0 is parked: it holds the partition
    now[0] += applier.settings.causal_timeout_s + 1
    acks = await applier.tick()
    assert fence.calls == [{tp}]
    assert dlq.letters == [] and acks == []
    assert applier.gate.parked_count == 0 and applier.tracker.committable(tp) is None
    assert await applier.process([rec(2, event(2))]) == []  # refused until assigned again
    applier.on_assigned([tp])
    await applier.process([rec(0, event(0, caused_by="e9"))])  # the re-read parks it again
    assert applier.gate.is_parked(("prod", "e0")) and dlq.letters == []
    assert [e.event_id for b in committer.batches for e in b.events] == ["e1"]


async def test_expiries_are_fenced_once_per_tick_for_all_their_partitions_and_then_dead_lettered() -> None:
    applier, _, dlq, _ = make()
    now = [100.0]
    applier.clock = lambda: now[0]
    applier.fence = fence = Fence(ok=True)
    other = RawRecord("onto.changes.objects", 1, 0, b"prod::p5", event(5, caused_by="e8"), [], "x0")
    await applier.process([rec(0, event(0, caused_by="e9")), rec(1, event(1, caused_by="e9")), other])
    await applier.tick()
    assert fence.calls == []  # nothing due: no fence asked
    now[0] += applier.settings.causal_timeout_s + 1
    acks = await applier.tick()
    assert fence.calls == [{("onto.changes.objects", 0), ("onto.changes.objects", 1)}]
    assert sorted((d.event_id, d.reason) for d in dlq.letters) == [
        ("e0", "cause-missing"),
        ("e1", "cause-missing"),
        ("e5", "cause-missing"),
    ]
    assert sorted(acks) == ["h0", "h1", "x0"]


def behind_reading(effect_read_at_s: float) -> ReadTime:
    """Partition 0 read up to an effect read at ``effect_read_at_s``; partition 1 an hour behind it."""
    reading = ReadTime()
    reading.assigned({(OBJECTS, 0), (OBJECTS, 1)})
    reading.read((OBJECTS, 0), 2, int(effect_read_at_s * 1000))
    reading.fetched((OBJECTS, 0), 3, 3)
    reading.read((OBJECTS, 1), 5, int((effect_read_at_s - 3600) * 1000))
    reading.fetched((OBJECTS, 1), 6, 100)  # 94 records still unread there
    return reading


async def test_an_effect_whose_cause_is_still_unread_on_a_partition_behind_is_not_dead_lettered() -> None:
    """The soak's ``cause-missing`` (2026-12-02): a worker behind read the effect long before its
    cause's partition got that far. The wall clock passes the timeout; the effect stays parked
    (failed before: dead-lettered at that tick) and is applied once its cause is read; once the
    partition behind is read to its end, a wait whose cause truly never comes expires."""
    applier, committer, dlq, _ = make()
    now = [100.0]
    applier.clock = lambda: now[0]
    applier.fence = fence = Fence(ok=True)
    applier.reading = reading = behind_reading(time.time() - 1_000)
    await applier.process([rec(0, event(0, caused_by="e9")), rec(1, event(1)), rec(2, event(2, caused_by="e8"))])
    now[0] += applier.settings.causal_timeout_s + 1
    await applier.tick()
    assert dlq.letters == [] and fence.calls == [] and applier.gate.parked_count == 2
    cause = RawRecord(OBJECTS, 1, 6, b"prod::p9", event(9), [], "x6")
    reading.read((OBJECTS, 1), 6, int((time.time() - 900) * 1000))
    reading.fetched((OBJECTS, 1), 7, 7)  # now read to its end: read time is now
    await applier.process([cause])
    assert {e.event_id for b in committer.batches for e in b.events} == {"e0", "e1", "e9"}
    await applier.tick()
    assert [(d.event_id, d.reason) for d in dlq.letters] == [("e2", "cause-missing")]


async def test_a_worker_held_back_below_the_hard_bound_waits_for_read_time() -> None:
    """Held back by parked events below the hard bound, the partitions behind are still read
    (``to_pause``), so read time moves: a wait whose cause may still be unread there is kept.
    Failed before: held back meant the wall clock alone, e0 was dead-lettered."""
    applier, _, dlq, _ = make()
    applier.settings = applier.settings.replace(max_unacked_records=3)
    now = [100.0]
    applier.clock = lambda: now[0]
    applier.reading = behind_reading(time.time() - 1_000)
    await applier.process([rec(0, event(0, caused_by="e9")), rec(1, event(1)), rec(2, event(2))])
    assert applier.backpressure
    assert applier.to_pause([(OBJECTS, 0), (OBJECTS, 1)]) == {(OBJECTS, 0)}  # partition 1 is behind
    now[0] += applier.settings.causal_timeout_s + 1
    await applier.tick()
    assert dlq.letters == []


async def test_a_worker_held_back_past_the_hard_bound_expires_on_the_wall_clock() -> None:
    """Parked events that hold twice ``max_unacked_records`` pause every partition, so read time
    cannot move: waiting on it would stall the worker for good. The wall clock alone decides then."""
    applier, _, dlq, _ = make()
    applier.settings = applier.settings.replace(max_unacked_records=3)
    now = [100.0]
    applier.clock = lambda: now[0]
    applier.reading = behind_reading(time.time() - 1_000)
    await applier.process([rec(0, event(0, caused_by="e9"))] + [rec(i, event(i)) for i in range(1, 6)])
    assert applier.to_pause([(OBJECTS, 0), (OBJECTS, 1)]) == {(OBJECTS, 0), (OBJECTS, 1)}
    now[0] += applier.settings.causal_timeout_s + 1
    await applier.tick()
    assert [(d.event_id, d.reason) for d in dlq.letters] == [("e0", "cause-missing")]


async def test_a_committed_record_behind_a_parked_one_lets_its_bytes_go_and_keeps_its_ack_place() -> None:
    """A parked event holds its partition's later acks, not their bytes: once committed, a record
    is needed by no dead letter. Failed before: all three records stayed until the ack (a lagging
    ``full`` worker held at least 90k committed records so). The parked one keeps its own bytes for its letter."""
    applier, committer, dlq, _ = make()
    now = [100.0]
    applier.clock = lambda: now[0]
    parked = event(0, caused_by="e9")
    broken = rec(2, b"{broken", key=b"prod::x")
    acks = await applier.process([rec(0, parked), rec(1, event(1)), broken, rec(3, event(3))])
    tp = (OBJECTS, 0)
    assert acks == [] and [e.event_id for b in committer.batches for e in b.events] == ["e1", "e3"]
    assert set(applier._records[tp]) == {0}
    assert [offset for offset, _ in applier._handles[tp]] == [0, 1, 2, 3]
    now[0] += applier.settings.causal_timeout_s + 1
    acks = await applier.tick()
    assert [(d.event_id, d.reason, d.value) for d in dlq.letters if d.reason == "cause-missing"] == [
        ("e0", "cause-missing", parked)
    ]
    assert acks == ["h0", "h1", "h2", "h3"] and applier._records[tp] == {}


class BranchLog(FakeCommitter):
    """A committer whose branch log holds ``applied`` event ids; records each cause lookup."""

    def __init__(self, applied: set[str]) -> None:
        super().__init__()
        self.applied = applied
        self.lookups: list[set[str]] = []

    async def applied_events_async(self, world_id: str, ids: set[str]) -> set[str]:
        self.lookups.append(set(ids))
        return ids & self.applied


def cause_lookup_applier(now: list[float]) -> tuple[Applier, BranchLog]:
    """An applier whose clock reads ``now[0]``, with a branch log holding the cause ``c1``."""
    settings = Settings.from_env({}).replace(batch_max_events=100, batch_max_seconds=0.0, causal_timeout_s=40.0)
    committer = BranchLog({"c1"})
    return applier_with(settings, committer, FakeMarks(), clock=lambda: now[0]), committer


async def test_while_the_intake_is_behind_a_cause_is_looked_up_on_the_branch_later_but_before_expiry() -> None:
    """A full poll means a backlog: a cause unknown for a second is most likely still in it (another
    partition), and each branch lookup scans the world's log while the intake waits. Behind, the
    first lookup waits a quarter of the causal timeout; the rechecks keep the last one before expiry."""
    now = [100.0]
    applier, committer = cause_lookup_applier(now)
    applier.behind = True
    await applier.process([rec(0, event(0, caused_by="c1"))])
    assert applier.gate.is_parked(("prod", "e0"))
    now[0] += 1.5  # past the 1-s grace of a caught-up intake
    await applier.tick()
    assert committer.lookups == []  # before: looked up here, while the cause was still on its way
    now[0] += 10.0 - 1.5  # a quarter of the causal timeout
    await applier.tick()
    await applier.causes_looked_up(now[0])
    acks = await applier.tick()
    assert committer.lookups == [{"c1"}] and acks == ["h0"]
    assert [e.event_id for b in committer.batches for e in b.events] == ["e0"]


async def test_a_caught_up_intake_looks_a_missing_cause_up_after_the_short_grace() -> None:
    now = [100.0]
    applier, committer = cause_lookup_applier(now)
    await applier.process([rec(0, event(0, caused_by="c1"))])
    now[0] += 1.5
    await applier.tick()
    await applier.causes_looked_up(now[0])
    acks = await applier.tick()
    assert committer.lookups == [{"c1"}] and acks == ["h0"]


class HeldBranchLog(BranchLog):
    """A branch log whose lookups wait until ``opened`` is set."""

    def __init__(self, applied: set[str]) -> None:
        super().__init__(applied)
        self.opened = asyncio.Event()

    async def applied_events_async(self, world_id: str, ids: set[str]) -> set[str]:
        self.lookups.append(set(ids))
        await self.opened.wait()
        return ids & self.applied


async def parked_behind_a_held_lookup(now: list[float]) -> tuple[Applier, HeldBranchLog]:
    """An applier (clock ``now[0]``) with e0 parked on cause ``c1``, 1.5 s later: its lookup is due."""
    committer = HeldBranchLog({"c1"})
    settings = Settings.from_env({}).replace(batch_max_events=100, batch_max_seconds=0.0, causal_timeout_s=40.0)
    applier = applier_with(settings, committer, FakeMarks(), clock=lambda: now[0])
    await applier.process([rec(0, event(0, caused_by="c1"))])
    now[0] += 1.5
    return applier, committer


async def test_a_cause_lookup_in_flight_does_not_hold_the_intakes_next_poll() -> None:
    """A branch lookup reads the world's log in a thread; awaited inside a poll's step it held the
    applier's lock, so the intake read nothing until it returned (in a soak at 5,000/s the lookups
    found nothing: the causes were still in the backlog). Now it runs beside the steps, and what it
    finds is released by the next tick, before anything expires."""
    now = [100.0]
    applier, committer = await parked_behind_a_held_lookup(now)
    await asyncio.wait_for(applier.process([rec(1, event(1))]), 5)  # before: waited for the lookup
    assert committer.lookups == [{"c1"}]
    assert [e.event_id for b in committer.batches for e in b.events] == ["e1"]
    assert await asyncio.wait_for(applier.process([rec(2, event(2))]), 5) == []  # offset 0 still parked
    committer.opened.set()
    await applier.causes_looked_up(now[0])
    acks = await applier.tick()
    assert acks == ["h0", "h1", "h2"] and committer.lookups == [{"c1"}]
    assert [e.event_id for b in committer.batches for e in b.events] == ["e1", "e2", "e0"]


async def test_a_lookup_in_flight_lands_before_its_effects_expire() -> None:
    """The tick that would expire parked events waits for the cause lookup in flight first: a
    cause the branch holds releases its effect, never dead-letters it."""
    now = [100.0]
    applier, committer = await parked_behind_a_held_lookup(now)
    await asyncio.wait_for(applier.tick(), 5)  # the lookup starts and is held (before: the tick waited)
    now[0] += 40.0  # the effect is due to expire
    tick = asyncio.ensure_future(applier.tick())
    await asyncio.sleep(0.05)
    assert not tick.done()
    committer.opened.set()
    acks = await asyncio.wait_for(tick, 5)
    acks += await applier.tick()
    assert not applier.dlq.letters  # type: ignore[attr-defined]
    assert [e.event_id for b in committer.batches for e in b.events] == ["e0"] and acks == ["h0"]


async def test_a_tick_with_100_idle_worlds_touches_none_of_their_gauges() -> None:
    """A tick sets the gauges of worlds whose parked or in-flight figures moved, not of every known
    world: at 100 worlds that was ~200 gauge sets every 0.25 s whatever the traffic."""

    class EveryWorld(FakeWorlds):
        async def exists(self, world_id: str) -> bool:
            return True

    settings = Settings.from_env({}).replace(batch_max_events=100, batch_max_seconds=0.0)
    applier = applier_with(settings, FakeCommitter(), FakeMarks(), worlds=EveryWorld())
    worlds = [f"w{i}" for i in range(100)]
    await applier.process([rec(i, event(i, world=w)) for i, w in enumerate(worlds)])  # all committed
    await applier.tick()  # each world's gauges once (parked 0, in flight 0)
    assert applier.metrics.registry.get_sample_value("causeway_inflight_events", {"world": "w99"}) == 0
    touched: list[str] = []
    set_parked, inflight = applier.metrics.set_parked, applier.metrics.inflight
    applier.metrics.set_parked = lambda w, n: (touched.append(w), set_parked(w, n))  # type: ignore[method-assign]
    applier.metrics.inflight = lambda w, n, at: (touched.append(w), inflight(w, n, at))  # type: ignore[method-assign]
    await applier.tick()
    assert touched == []
    # A world whose figures move is exported, and once more when it is idle again.
    await applier.process([rec(100, event(100, world="w7", caused_by="e999"))])  # parked
    await applier.tick()
    assert sorted(set(touched)) == ["w7"]
    get = applier.metrics.registry.get_sample_value
    assert get("causeway_parked_events", {"world": "w7"}) == 1
    assert get("causeway_inflight_events", {"world": "w7"}) == 1
    touched.clear()
    await applier.process([rec(101, event(999, world="w7"))])  # the cause: both commit
    await applier.tick()
    await applier.tick()
    assert touched == ["w7", "w7"]  # parked and in flight back to 0, once
    assert get("causeway_parked_events", {"world": "w7"}) == 0
    assert get("causeway_inflight_events", {"world": "w7"}) == 0


async def test_a_poll_of_interleaved_partitions_acks_each_in_order_and_leaves_a_fenced_one_untouched() -> None:
    """A poll comes in runs of one partition (``process`` looks a run's queues up once): runs that
    come back, another topic's run (its own kind: an object event on the links topic is refused)
    and a fenced partition's run, whose records are neither processed nor queued."""
    applier, committer, dlq, _ = make()
    links = applier.settings.links_topic
    fenced = (OBJECTS, 2)
    applier.tracker.revoke(fenced, fence=True)

    def at(partition: int, offset: int, n: int, topic: str = OBJECTS) -> RawRecord:
        handle = f"{'h' if topic == OBJECTS else 'l'}{partition}-{offset}"
        return RawRecord(topic, partition, offset, f"prod::p{n}".encode(), event(n), [], handle)

    acks = await applier.process(
        [at(0, 0, 1), at(0, 1, 2), at(1, 0, 3), at(2, 0, 4), at(0, 2, 5), at(0, 2, 5), at(0, 3, 6, links), at(1, 1, 7)]
    )
    assert sorted(e.event_id for b in committer.batches for e in b.events) == ["e1", "e2", "e3", "e5", "e7"]
    assert [(d.topic, d.reason) for d in dlq.letters] == [(links, "wrong-topic")]
    assert [a for a in acks if a.startswith("h0-")] == ["h0-0", "h0-1", "h0-2"]  # the repeat of offset 2 skipped
    assert [a for a in acks if a.startswith("h1-")] == ["h1-0", "h1-1"]
    assert "l0-3" in acks  # dead-lettered: settled
    assert fenced not in applier._handles and fenced not in applier._records


async def test_a_world_flushes_at_batch_flush_events_while_polls_stay_at_batch_max_events() -> None:
    """Before: a world flushed only at ``batch_max_events`` (10,000), so with three worlds no commit
    started before some 30,000 events were read, and the intake and the commits never overlapped."""
    settings = Settings.from_env({}).replace(batch_max_events=100, batch_flush_events=4, batch_max_seconds=60.0)
    committer = FakeCommitter()
    applier = applier_with(settings, committer, FakeMarks())
    await applier.process([rec(n, event(n)) for n in range(3)])
    assert committer.batches == []
    await applier.process([rec(3, event(3))])
    assert [len(b.events) for b in committer.batches] == [4]
    small = applier_with(settings.replace(batch_max_events=2), FakeCommitter(), FakeMarks())
    assert small.batches.max_events == 2  # never past the poll's own size


async def test_a_busy_worker_waits_longer_before_an_idle_flush() -> None:
    """The tick reads the process's CPU clock: near a full core an idle world's batch waits up to
    batch_max_seconds instead of the idle minimum; with CPU to spare it flushes at the minimum."""
    now, cpu = [100.0], [0.0]
    settings = Settings.from_env({}).replace(
        batch_max_events=100, batch_max_seconds=5.0, batch_idle_min_seconds=0.5, batch_busy_cpu=0.8
    )
    committer = FakeCommitter()
    applier = applier_with(settings, committer, FakeMarks(), clock=lambda: now[0])
    applier.cpu_clock = lambda: cpu[0]
    applier.idle = True
    await applier.tick()  # starts the CPU clock
    now[0] += 3.0
    cpu[0] += 3.0  # a whole core for the last three seconds
    await applier.tick()
    assert applier.batches.idle_age == 5.0
    await applier.process([rec(0, event(0))])
    now[0] += 1.0  # the CPU clock stands still from now on: the load falls
    await applier.tick()
    assert committer.batches == []  # 1 s old: past the idle minimum, but the worker was busy
    now[0] += 1.0
    await applier.tick()
    assert applier.batches.idle_age < 2.0
    assert [e.event_id for b in committer.batches for e in b.events] == ["e0"]  # 2 s old, before the 5 s age flush
    quiet = applier_with(settings, FakeCommitter(), FakeMarks(), clock=lambda: now[0])
    assert quiet.cpu_clock is None  # tests and replays: no CPU clock, never stretched
    await quiet.tick()
    assert quiet.batches.idle_age == 0.5


async def test_catching_up_with_a_backlog_flushes_its_rest_without_the_idle_minimum() -> None:
    now = [100.0]
    settings = Settings.from_env({}).replace(batch_max_events=100, batch_max_seconds=60.0, batch_idle_min_seconds=5.0)
    committer = FakeCommitter()
    applier = applier_with(settings, committer, FakeMarks(), clock=lambda: now[0])
    applier.behind = True
    await applier.process([rec(0, event(0))])
    now[0] += 0.1
    applier.idle, applier.behind = True, False  # the next poll was not full
    assert applier.caught_up_at == now[0]
    await applier.tick()
    assert [e.event_id for b in committer.batches for e in b.events] == ["e0"]
    await applier.process([rec(1, event(1))])  # a trickle after the catch-up waits the idle minimum
    assert len(committer.batches) == 1
