"""Dead-letter decisions per origin: a record dead-lettered before a crash is settled when it is
redelivered, never decided again (issue 12, "exactly one dead letter with a reason")."""

from __future__ import annotations

from typing import Any

from agents.applier import Applier, RawRecord
from agents.letter_marks import by_tag, dead_key, letter_key
from models.deadletter import H_REDRIVE, DeadLetter
from monitoring.metrics import Metrics
from streams.settings import Settings
from tests.fakes import FakeCommitter, FakeDlq, FakeMarks, FakeWorlds, event, rec

OBJ = "onto.changes.objects"


class FakeDeadMarks:
    def __init__(self) -> None:
        self.keys: set[str] = set()

    async def recorded(self, keys: Any) -> set[str]:
        return {k for k in keys if k in self.keys}

    async def record(self, keys: Any) -> int:
        self.keys |= set(keys)
        return len(keys)


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
    assert dead_key((OBJ, 3, 17), None) == f"causeway:dead:{{{OBJ}:3}}:17"
    assert dead_key((OBJ, 3, 17), "NOT}VALID") == f"causeway:dead:{{{OBJ}:3}}:17"
    letter = DeadLetter("malformed-json", "bad", OBJ, 3, 17, b"k", b"{", None, "bad world!")
    assert letter_key(letter) == dead_key((OBJ, 3, 17), None)
    keys = [dead_key((OBJ, 0, i), w) for i, w in enumerate(["a", "b", "a", None, None, "a"])]
    assert sorted(len(g) for g in by_tag(keys + keys[:2], chunk=2)) == [1, 1, 2, 2]


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
