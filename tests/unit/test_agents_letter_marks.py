"""Dead-letter decisions per origin: a record dead-lettered before a crash is settled when it is
redelivered, never decided again (issue 12, "exactly one dead letter with a reason")."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from agents import faults
from agents.applier import EARLY_LOOKUP, Applier, RawRecord
from agents.letter_marks import (
    CONFIRMED,
    EVENT_REASONS,
    WorldLookup,
    arrival_keys,
    by_tag,
    dead_key,
    event_key,
    letter_key,
    letter_keys,
    redrive_count,
    world_lookups,
)
from agents.offset_tracker import Arrival
from models.deadletter import H_REDRIVE, DeadLetter
from models.events import ChangeEvent, decode
from monitoring.metrics import Metrics
from sinks.committed_offsets import Source
from streams.settings import Settings
from tests.fakes import FakeCommitter, FakeDlq, FakeMarks, FakeWorlds, HeldMarks, event, rec

OBJ = "onto.changes.objects"


class FakeDeadMarks:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        #: Per lookup: the keys given one by one, and the records' keys given per world.
        self.lookups: list[tuple[list[str], list[str]]] = []

    @property
    def keys(self) -> set[str]:
        return set(self.values)

    async def states(self, keys: Any, worlds: Mapping[str, WorldLookup] | None = None) -> dict[str, bytes]:
        keys = list(keys)
        of_worlds = [k for look in (worlds or {}).values() for k in look.keys()]
        self.lookups.append((keys, of_worlds))
        return {k: self.values[k] for k in keys + of_worlds if k in self.values}

    async def record(self, keys: Any, value: bytes = CONFIRMED) -> int:
        self.values.update(dict.fromkeys(keys, value))
        return len(keys)

    async def forget(self, states: Any) -> int:
        gone = [k for k, v in states.items() if self.values.get(k) == v]
        for k in gone:
            del self.values[k]
        return len(gone)


class Shared:
    """What outlives a worker: Redis (applied and dead-letter marks), the DLQ topic, the branch."""

    def __init__(self) -> None:
        self.marks, self.dead, self.dlq, self.committer = FakeMarks(), FakeDeadMarks(), FakeDlq(), FakeCommitter()
        self.now = 100.0

    def worker(self, *, dead_marks: bool = True) -> Applier:
        settings = Settings.from_env({}).replace(batch_max_events=100, batch_max_seconds=0.0, causal_timeout_s=5.0)
        return Applier(
            settings,
            marks=self.marks,
            committer=self.committer,
            dead_letters=self.dlq,
            worlds=FakeWorlds(),
            metrics=Metrics(),
            clock=lambda: self.now,
            dead_marks=self.dead if dead_marks else None,
        )

    def applied(self) -> list[str]:
        return [e.event_id for b in self.committer.batches for e in b.events]


def test_keys_carry_the_world_as_hash_tag_or_the_partition_when_the_world_is_unknown() -> None:
    assert dead_key((OBJ, 3, 17), "prod") == f"causeway:dead:{{prod}}:{OBJ}:3:17"
    assert dead_key((OBJ, 3, 17), "prod", "e5") == f"causeway:dead:{{prod}}:{OBJ}:3:17:e5"
    assert dead_key((OBJ, 3, 17), None) == f"causeway:dead:{{{OBJ}:3}}:17"
    assert dead_key((OBJ, 3, 17), "NOT}VALID") == f"causeway:dead:{{{OBJ}:3}}:17"
    letter = DeadLetter("malformed-json", "bad", OBJ, 3, 17, b"k", b"{", None, "bad world!")
    assert letter_key(letter) == dead_key((OBJ, 3, 17), None)
    keys = [dead_key((OBJ, 0, i), w) for i, w in enumerate(["a", "b", "a", None, None, "a"])]
    assert sorted(len(g) for g in by_tag(keys + keys[:2], chunk=2)) == [1, 1, 2, 2]


async def test_a_decision_recorded_at_an_origin_does_not_settle_another_event_read_there_later() -> None:
    """A topic created again (or a broker's data reset) reuses offsets while Redis keeps the decisions
    for days: the event now read at an origin whose earlier record was dead-lettered is a new event,
    applied, not settled as a replay. Before, the decision was keyed by the origin alone and the new
    event was settled unapplied and unlettered (seen: two events lost from a world after a reset)."""
    shared = Shared()
    first = shared.worker()
    await first.process([rec(0, event(1, caused_by="e9"))])
    shared.now += 6.0
    await first.tick()
    assert [(d.event_id, d.reason, d.offset) for d in shared.dlq.letters] == [("e1", "cause-missing", 0)]
    # The topic is created again: offset 0 now holds another event.
    second = shared.worker()
    await second.process([rec(0, event(2))])
    await second.tick()
    assert shared.applied() == ["e2"]
    assert len(shared.dlq.letters) == 1


async def test_an_event_dead_lettered_cause_missing_then_redelivered_after_its_cause_arrived_is_not_applied() -> None:
    """cause-missing after the timeout, SIGKILL before the offset commit, redelivered with the cause
    behind it: the letter stands (settled as a replay), the event never takes effect, no second letter."""
    shared = Shared()
    first = shared.worker()
    acks = await first.process([rec(0, event(1, caused_by="e9"))])
    assert acks == [] and first.gate.is_parked(("prod", "e1"))
    shared.now += 6.0  # past the causal timeout
    acks = await first.tick()
    assert [(d.event_id, d.reason) for d in shared.dlq.letters] == [("e1", "cause-missing")]
    assert acks == ["h0"]  # the intake would commit offset 1 next; the worker dies before it does
    second = shared.worker()  # the next owner re-reads from the committed offset (0)
    acks = await second.process([rec(0, event(1, caused_by="e9")), rec(1, event(9))])
    await second.tick()
    assert shared.applied() == ["e9"]
    assert [(d.event_id, d.reason) for d in shared.dlq.letters] == [("e1", "cause-missing")]
    assert acks == ["h0", "h1"]
    assert second.totals["dead_letter_replays"] == 1
    sample = second.metrics.registry.get_sample_value(
        "causeway_events_total", {"world": "prod", "outcome": "dead_letter_replay", "reason": ""}
    )
    assert sample == 1


async def test_without_the_recorded_decision_the_redelivered_event_takes_effect_despite_its_letter() -> None:
    """The gap this closes, shown on the same scenario with no dead-letter marks (the code before)."""
    shared = Shared()
    first = shared.worker(dead_marks=False)
    await first.process([rec(0, event(1, caused_by="e9"))])
    shared.now += 6.0
    await first.tick()
    second = shared.worker(dead_marks=False)
    await second.process([rec(0, event(1, caused_by="e9")), rec(1, event(9))])
    await second.tick()
    assert sorted(shared.applied()) == ["e1", "e9"]  # took effect although dead-lettered
    assert len(shared.dlq.letters) == 1


async def test_a_bad_record_redelivered_after_its_letter_gets_no_second_letter() -> None:
    shared = Shared()
    await shared.worker().process([rec(0, b"{broken", key=b"prod::x"), rec(1, event(1))])
    second = shared.worker()
    acks = await second.process([rec(0, b"{broken", key=b"prod::x"), rec(1, event(1))])
    assert [d.reason for d in shared.dlq.letters] == ["malformed-json"]
    assert acks == ["h0", "h1"]  # e1 is a duplicate (marked), the bad record a replayed letter
    assert second.totals["dead_letter_replays"] == 1


async def test_a_redriven_letter_is_a_new_record_and_is_decided_again() -> None:
    """``dlq redrive`` republishes the letter at a new offset: a new origin, so once its cause has
    landed it takes effect, while a redelivery of the original offset stays settled."""
    shared = Shared()
    first = shared.worker()
    await first.process([rec(0, event(1, caused_by="e9"))])
    shared.now += 6.0
    await first.tick()
    second = shared.worker()
    acks = await second.process([rec(0, event(1, caused_by="e9")), rec(1, event(9))])
    redriven = RawRecord(OBJ, 0, 2, b"prod::p1", event(1, caused_by="e9"), [(H_REDRIVE, b"1")], "h2")
    acks += await second.process([redriven])
    assert shared.applied() == ["e9", "e1"]
    assert len(shared.dlq.letters) == 1
    assert acks == ["h0", "h1", "h2"]


def applied_from(shared: Shared) -> list[tuple[str, int]]:
    """(event id, source offset) of every committed event, in commit order."""
    return [
        (e.event_id, s.offset) for b in shared.committer.batches for e, s in zip(b.events, b.sources or [], strict=True)
    ]


async def test_a_rejection_the_gate_holds_at_a_revoke_is_dead_lettered_not_dropped() -> None:
    """The gate rejected an event of a partition we keep, and its output is drained by the revoke of
    another partition: the letter goes out and the kept partition's offset moves past it (it used to
    be dropped: no letter, and the offset held back until the next restart)."""
    shared = Shared()
    worker = shared.worker()
    kept = RawRecord(OBJ, 1, 0, b"prod::p1", event(1, caused_by="e9"), [], "x0")
    await worker.process([kept, rec(0, event(2))])
    assert worker.gate.is_parked(("prod", "e1"))
    shared.now += 6.0
    worker.gate.expire(shared.now)  # decided; drained by whatever collects the gate's output next
    await worker.revoke([(OBJ, 0)])
    assert [(d.event_id, d.reason) for d in shared.dlq.letters] == [("e1", "cause-missing")]
    assert worker.tracker.committable((OBJ, 1)) == 1
    assert shared.dead.values[dead_key((OBJ, 1, 0), "prod", "e1")] == CONFIRMED


async def test_a_producer_retry_copy_of_a_dead_lettered_event_at_another_offset_gets_the_same_decision() -> None:
    """e1 is dead-lettered (cause-missing); its cause lands; then a producer-retry copy of e1 arrives
    at another offset. The copy is settled by e1's decision: no effect, no second letter (it used to
    be decided on its own and took effect although e1 has a letter)."""
    shared = Shared()
    worker = shared.worker()
    await worker.process([rec(0, event(1, caused_by="e9"))])
    shared.now += 6.0
    acks = await worker.tick()
    acks += await worker.process([rec(1, event(9)), rec(2, event(1, caused_by="e9"))])
    acks += await worker.tick()
    assert applied_from(shared) == [("e9", 1)]
    assert [(d.event_id, d.offset, d.reason) for d in shared.dlq.letters] == [("e1", 0, "cause-missing")]
    assert acks == ["h0", "h1", "h2"]
    assert worker.totals["dead_letter_replays"] == 1


async def test_each_redrive_is_decided_afresh_and_copies_of_a_redrive_share_its_decision() -> None:
    """Redrive 1 of e1 fails again (its cause is still missing); a copy of redrive 1 gets that decision
    even after the cause landed; redrive 2 is decided afresh and takes effect."""
    shared = Shared()
    worker = shared.worker()
    await worker.process([rec(0, event(1, caused_by="e9"))])
    shared.now += 6.0
    await worker.tick()
    await worker.process([rec(1, event(1, caused_by="e9"), headers=[(H_REDRIVE, b"1")])])
    shared.now += 6.0
    await worker.tick()
    await worker.process([rec(2, event(9)), rec(3, event(1, caused_by="e9"), headers=[(H_REDRIVE, b"1")])])
    await worker.process([rec(4, event(1, caused_by="e9"), headers=[(H_REDRIVE, b"2")])])
    await worker.tick()
    assert applied_from(shared) == [("e9", 2), ("e1", 4)]
    assert [(d.offset, d.redrive_count) for d in shared.dlq.letters] == [(0, 0), (1, 1)]
    assert worker.totals["dead_letter_replays"] == 1


class Killed(BaseException):
    """SIGKILL in a unit test: nothing after the fault point runs (``_retry`` does not catch it)."""


class ScannableDlq(FakeDlq):
    """The DLQ topic, with the scan a worker runs for decisions it finds pending."""

    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    async def letter_keys_since(self, since_ms: int) -> set[str]:
        self.scans += 1
        return {k for dl in self.letters for k in letter_keys(dl)}


async def _killed_after_the_letter(shared: Shared, monkeypatch: Any, *, sent: bool) -> Applier:
    """A worker dead-letters e1 (cause-missing) and is killed after the broker confirmed the letter
    (``sent``) or just before the publish; the decision stays pending."""
    shared.dlq = ScannableDlq()
    first = shared.worker()
    await first.process([rec(0, event(1, caused_by="e9"))])
    shared.now += 6.0

    def reached(point: str) -> None:
        if point == "after-dead-letter":
            raise Killed

    async def publish(letters: Any) -> None:
        raise Killed

    monkeypatch.setattr(faults, "reached", reached)
    if not sent:
        monkeypatch.setattr(shared.dlq, "publish", publish)
    with pytest.raises(Killed):
        await first.tick()
    monkeypatch.undo()
    assert set(shared.dead.values.values()) == {b"p:" + shared.dead.values[dead_key((OBJ, 0, 0), "prod", "e1")][2:]}
    return shared.worker()


async def test_killed_between_the_confirmed_letter_and_its_decision_the_redelivery_gets_no_second_letter(
    monkeypatch: Any,
) -> None:
    shared = Shared()
    second = await _killed_after_the_letter(shared, monkeypatch, sent=True)
    assert [d.event_id for d in shared.dlq.letters] == ["e1"]
    acks = await second.process([rec(0, event(1, caused_by="e9")), rec(1, event(9))])
    assert applied_from(shared) == [("e9", 1)]  # e1 stays dead-lettered although its cause is here now
    assert [d.event_id for d in shared.dlq.letters] == ["e1"]
    assert acks == ["h0", "h1"]
    assert isinstance(shared.dlq, ScannableDlq) and shared.dlq.scans == 1
    assert set(shared.dead.values.values()) == {CONFIRMED}


async def test_killed_before_the_letter_went_out_the_redelivery_is_decided_again(monkeypatch: Any) -> None:
    shared = Shared()
    second = await _killed_after_the_letter(shared, monkeypatch, sent=False)
    assert shared.dlq.letters == []
    acks = await second.process([rec(0, event(1, caused_by="e9"))])
    shared.now += 6.0
    acks += await second.tick()
    assert [(d.event_id, d.reason) for d in shared.dlq.letters] == [("e1", "cause-missing")]
    assert acks == ["h0"]
    assert set(shared.dead.values.values()) == {CONFIRMED}


async def test_a_pending_decision_whose_letter_never_went_out_is_cleared_when_the_record_is_applied(
    monkeypatch: Any,
) -> None:
    """Killed before the letter went out, the redelivered record is decided again and applied (its
    cause arrived meanwhile). Before, its pending keys (origin and event) stayed until the TTL
    (``dedupe_ttl_s``, 7 days), and every later lookup of them read the DLQ topic again: here a
    producer-retry copy of the applied event at another offset."""
    shared = Shared()
    second = await _killed_after_the_letter(shared, monkeypatch, sent=False)
    assert isinstance(shared.dlq, ScannableDlq)
    acks = await second.process([rec(0, event(1, caused_by="e9")), rec(1, event(9))])
    assert applied_from(shared) == [("e9", 1), ("e1", 0)]  # the cause first, in one commit
    assert acks == ["h0", "h1"] and shared.dlq.letters == [] and shared.dlq.scans == 1
    assert shared.dead.values == {}  # was: both keys still pending
    acks = await second.process([rec(2, event(1, caused_by="e9"))])  # a producer-retry copy of e1
    assert acks == ["h2"] and shared.dlq.scans == 1 and shared.dlq.letters == []


def test_the_applier_s_reasons_about_valid_events_are_recorded_per_event() -> None:
    from agents import applier as applier_module

    for reason in (applier_module.UNKNOWN_WORLD, applier_module.STALE_VERSION, applier_module.COMMIT_FAILED):
        assert reason in EVENT_REASONS
    letter = DeadLetter("cause-missing", "d", OBJ, 0, 5, b"k", b"{}", "e1", "prod", redrive_count=2)
    assert letter_keys(letter) == [dead_key((OBJ, 0, 5), "prod", "e1"), event_key("prod", "e1", 2)]
    bad = DeadLetter("malformed-json", "d", OBJ, 0, 6, b"k", b"{", "e1", "prod")
    assert letter_keys(bad) == [dead_key((OBJ, 0, 6), "prod", "e1")]  # a fixed re-send is decided afresh
    assert redrive_count([("x", b"1"), (H_REDRIVE, b"3")]) == 3 and redrive_count([(H_REDRIVE, b"?")]) == 0


async def test_the_cdc_ingest_leaves_out_letters_decided_before_and_records_the_others() -> None:
    """The CDC ingest uses the same decisions: a raw record dead-lettered before a crash (its offset
    not committed) is re-planned without its letter; a new bad record's decision goes pending, then
    confirmed after the produce."""
    from agents.cdc import CdcIngest
    from agents.letter_marks import Decisions
    from cdc.plan import plan_batch
    from tests.debezium_records import MAPPING, SETTINGS, TOPIC, Rec, good

    store = FakeDeadMarks()
    ingest = CdcIngest(SETTINGS, MAPPING, decisions=Decisions(store))
    recs = [Rec(TOPIC, 0, 10, b"{broken"), Rec(TOPIC, 0, 11, good(1)), Rec(TOPIC, 0, 12, b"{also broken")]
    plan = plan_batch(recs, MAPPING, SETTINGS, now_ms=1_000)
    first, second = (letter_key(dl) for dl in plan.dead_letters)
    await store.record([first])  # dead-lettered by the run that crashed before its offset commit
    keys = await ingest._decide_letters(plan)  # noqa: SLF001
    assert [dl.offset for dl in plan.dead_letters] == [12]
    assert [(o.topic, dict(o.headers or []).get("causeway.source.offset")) for o in plan.outgoing] == [
        ("objs", None),
        ("dlq", b"12"),
    ]
    assert keys == [second] and store.values[second].startswith(b"p:")
    await ingest.decisions.published(keys)  # type: ignore[union-attr]
    assert store.values[second] == CONFIRMED


class RefusingProducer:
    """Sends to the DLQ succeed; sends to any other topic are refused as too large by the broker."""

    def __init__(self, dlq: str, sent: list[tuple[str, dict[str, bytes]]]) -> None:
        self.dlq, self.sent = dlq, sent

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, value: bytes, key: bytes | None = None, headers: Any = None) -> Any:
        from aiokafka.errors import MessageSizeTooLargeError

        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if topic == self.dlq:
            self.sent.append((topic, dict(headers or [])))
            future.set_result(None)
        else:
            future.set_exception(MessageSizeTooLargeError())
        return future


class OnePollConsumer:
    def __init__(self, records: list[Any]) -> None:
        from aiokafka import TopicPartition

        self.tp = TopicPartition(records[0].topic, records[0].partition)
        self.polls = [{self.tp: records}]
        self.commits: list[dict[Any, int]] = []

    def assignment(self) -> set[Any]:
        return {self.tp}

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[Any]]:
        return self.polls.pop(0) if self.polls else {}

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits.append(offsets)


async def test_the_cdc_one_record_fallback_does_not_send_a_decided_letter_again_and_records_its_own() -> None:
    """After the broker refuses a batch the ingest produces record by record, planning the batch
    again. Before, that plan skipped the decisions: a record whose letter was confirmed before a
    crash got a second letter, so did a letter the broker had taken from the refused batch, and the
    fallback's own ``event-too-large`` letter was never recorded (a crash before the offset commit
    would have sent it again too)."""
    from agents.cdc import CdcIngest
    from agents.letter_marks import Decisions
    from tests.debezium_records import MAPPING, SETTINGS, TOPIC, Rec, good

    store = FakeDeadMarks()
    ingest = CdcIngest(SETTINGS, MAPPING, decisions=Decisions(store))
    sent: list[tuple[str, dict[str, bytes]]] = []
    ingest._new_producer = lambda: RefusingProducer(SETTINGS.dlq_topic, sent)  # type: ignore[method-assign,assignment,return-value]  # noqa: SLF001

    async def no_limits() -> None:
        pass

    ingest.refresh_limits = no_limits  # type: ignore[method-assign]
    ingest._producer = ingest._new_producer()  # noqa: SLF001
    # 10: dead-lettered (confirmed) by the run that crashed before its offset commit; 11: a good
    # record the broker refuses; 12: a new bad record.
    recs = [Rec(TOPIC, 0, 10, b"{broken"), Rec(TOPIC, 0, 11, good(1)), Rec(TOPIC, 0, 12, b"{also broken")]
    consumer = OnePollConsumer(recs)
    ingest._consumer = consumer  # type: ignore[assignment]  # noqa: SLF001
    decided, too_large, fresh = (dead_key((TOPIC, 0, n), None) for n in (10, 11, 12))
    await store.record([decided])
    assert await ingest.step() == 3
    letters = Counter(h["causeway.source.offset"] for _, h in sent)
    assert letters[b"10"] == 0  # was 1: the fallback re-sent the decided letter
    assert letters[b"11"] == 1 and letters[b"12"] == 1  # was 2: the refused batch delivered it, then the fallback
    assert store.values[too_large] == CONFIRMED and store.values[fresh] == CONFIRMED  # 11 was unrecorded
    assert [c[consumer.tp] for c in consumer.commits] == [13]


def test_a_worlds_lookup_reads_the_keys_arrival_keys_gives_each_record() -> None:
    """The per-world parts the lookup script joins name exactly the keys of ``arrival_keys``,
    redrive counts included, for records of two worlds and two partitions."""
    arrivals = []
    for offset, (world, partition) in enumerate([("prod", 0), ("w-2", 3), ("prod", 3), ("prod", 0)]):
        ev = decode(event(offset + 1, world=world))
        assert isinstance(ev, ChangeEvent)
        arrivals.append(Arrival(ev, Source(OBJ, partition, 40 + offset)))
    redrives = {(OBJ, 3, 42): 2}
    looks = world_lookups(arrivals, redrives)
    assert sorted(looks) == ["prod", "w-2"]
    expected = {
        world: [
            k
            for a in arrivals
            if a.event.world_id == world
            for k in arrival_keys(a, redrives.get((a.topic, a.partition, a.offset), 0))
        ]
        for world in looks
    }
    assert {world: look.keys() for world, look in looks.items()} == expected
    assert looks["w-2"].redrives is None and looks["prod"].redrives == [0, 2, 0]


async def test_the_decisions_lookup_of_decoded_records_goes_per_world_not_two_keys_a_record() -> None:
    """A poll's lookup hands the store its decoded records per world (the script builds their keys)
    and builds keys one by one only for the records that failed to decode. Before, the applier
    formatted two keys a record (then re-read each key's hash tag to group it): ~11 % of the event
    loop on a worker. The decisions found are the same (the replay tests above)."""
    shared = Shared()
    worker = shared.worker()
    await worker.process([rec(i, event(i + 1)) for i in range(50)] + [rec(50, b"{", key=b"prod::x")])
    [(one_by_one, of_worlds)] = shared.dead.lookups
    assert one_by_one == [dead_key((OBJ, 0, 50), None)]  # the bad record's origin only
    assert len(of_worlds) == 100 and of_worlds[:2] == [
        dead_key((OBJ, 0, 0), "prod", "e1"),
        event_key("prod", "e1"),
    ]


class HeldDeadMarks(FakeDeadMarks):
    """Dead-letter lookups that wait while ``open_`` is clear; every lookup of both kinds logged."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log
        self.open_ = asyncio.Event()
        self.open_.set()

    async def states(self, keys: Any, worlds: Mapping[str, WorldLookup] | None = None) -> dict[str, bytes]:
        self.log.append("dead-letter lookup")
        await self.open_.wait()
        return await super().states(keys, worlds)


class LoggedMarks(HeldMarks):
    """``HeldMarks`` whose every dedupe lookup is logged."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def applied(self, pairs: Any) -> set[tuple[str, str]]:
        self.log.append("marks lookup")
        return await super().applied(pairs)


async def test_a_polls_marks_lookup_runs_beside_its_dead_letter_lookup_once_its_world_is_known() -> None:
    calls: list[str] = []
    shared = Shared()
    shared.marks, shared.dead = LoggedMarks(calls), HeldDeadMarks(calls)
    applier = shared.worker()
    # A world new to the worker: its marks are repaired first, so the lookups go one after the other.
    await applier.process([rec(0, event(0))])
    assert calls == ["dead-letter lookup", "marks lookup"]
    # Known now: while the dead-letter lookup waits on Redis, the marks lookup is already asked.
    calls.clear()
    shared.dead.open_.clear()
    step = asyncio.create_task(applier.process([rec(1, event(1)), rec(2, event(0))]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert calls == ["dead-letter lookup", "marks lookup"] and not step.done()
    shared.dead.open_.set()
    await step
    # The copy of e0 (applied in the first poll) is still dropped, e1 still applied once.
    assert shared.applied() == ["e0", "e1"]


async def test_a_poll_given_up_in_its_dead_letter_lookup_leaves_no_marks_lookup_behind() -> None:
    calls: list[str] = []
    shared = Shared()
    shared.marks, shared.dead = LoggedMarks(calls), HeldDeadMarks(calls)
    applier = shared.worker()
    await applier.process([rec(0, event(0))])
    shared.dead.open_.clear()
    shared.marks.lookups_open.clear()
    step = asyncio.create_task(applier.process([rec(1, event(1))]))
    for _ in range(20):
        await asyncio.sleep(0)
    [early] = [t for t in asyncio.all_tasks() if t.get_name() == EARLY_LOOKUP]
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    assert early.cancelled()
