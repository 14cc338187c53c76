"""The causal gate, alone and driven together with offsets, dedupe and batching through crashes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.batching import BatchAccumulator
from agents.causal import CAUSAL_CYCLE, CAUSE_MISSING, SELF_CAUSED, CausalGate, GateOutput
from agents.dedupe import STALE_VERSION, decide_versions, drop_duplicates, entity_ref, refs_to_check
from agents.offset_tracker import Arrival, EventRef, OffsetTracker
from agents.readtime import UNKNOWN, ReadTime, to_pause
from models.events import ChangeEvent, EntityKind
from sinks.committed_offsets import Source
from tests.factories import change_event

OBJECTS = "onto.changes.objects"
LINKS = "onto.changes.links"


def event(
    event_id: str,
    pk: str,
    caused_by: str | None = None,
    world: str = "w1",
    version: int = 1,
    kind: EntityKind = EntityKind.OBJECT,
) -> ChangeEvent:
    return change_event(
        event_id, world=world, kind=kind, pk=pk, version=version, after={"v": version}, caused_by=caused_by
    )


class Feed:
    """Numbers offsets per partition so unit tests read like the event stream they describe."""

    def __init__(self) -> None:
        self.next: dict[tuple[str, int], int] = {}

    def __call__(
        self, event_id: str, pk: str, caused_by: str | None = None, partition: int = 0, **kw: object
    ) -> Arrival:
        topic = str(kw.pop("topic", OBJECTS))
        off = self.next.get((topic, partition), 0)
        self.next[(topic, partition)] = off + 1
        return Arrival(event(event_id, pk, caused_by, **kw), Source(topic, partition, off))  # type: ignore[arg-type]


def ids(arrivals: Iterable[Arrival]) -> list[str]:
    return [a.event.event_id for a in arrivals]


def dead(out: GateOutput) -> list[tuple[str, str]]:
    return [(r.arrival.event.event_id, r.reason) for r in out.dead]


@pytest.fixture
def gate() -> CausalGate:
    return CausalGate(timeout_s=10.0, max_parked=100)


@pytest.fixture
def feed() -> Feed:
    return Feed()


# --- unit tests -----------------------------------------------------------------------------------


def test_no_cause_goes_straight_through(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("a", "p1"), now=0)
    gate.offer(feed("b", "p1"), now=0)
    out = gate.drain()
    assert ids(out.ready) == ["a", "b"] and not out.dead and not out.duplicates
    assert gate.pending_count == 2 and not gate.drain()


def test_effect_parks_and_its_key_queues_until_the_cause_arrives(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("e1", "p1", caused_by="c"), now=0)
    gate.offer(feed("e2", "p1"), now=0)  # no cause of its own, but keeps key order
    gate.offer(feed("x", "p2"), now=0)  # other keys are not held
    assert ids(gate.drain().ready) == ["x"]
    assert gate.parked_count == 2 and gate.unknown_causes() == {("w1", "c")}
    gate.offer(feed("c", "p3", partition=1), now=1)
    assert ids(gate.drain().ready) == ["c", "e1", "e2"]  # cause first, then the key in order
    assert gate.parked_count == 0 and gate.unknown_causes() == set()


def test_a_cause_pending_in_the_same_batch_releases_effects_after_it(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("c", "p1"), now=0)
    gate.offer(feed("e", "p2", caused_by="c"), now=0)
    assert ids(gate.drain().ready) == ["c", "e"]
    gate.committed([("w1", "c"), ("w1", "e")])
    assert gate.pending_count == 0
    gate.offer(feed("f", "p3", caused_by="c"), now=1)  # cause remembered as applied
    assert ids(gate.drain().ready) == ["f"]


def test_a_cause_applied_by_another_worker_is_learned(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("e", "p1", caused_by="c"), now=0)
    gate.offer(feed("e2", "p1", caused_by="e"), now=0)
    assert gate.unknown_causes() == {("w1", "c"), ("w1", "e")}  # e may be a copy applied elsewhere
    gate.learn_applied([("w1", "zzz")])
    assert not gate.drain()
    gate.learn_applied([("w1", "c")])
    assert ids(gate.drain().ready) == ["e", "e2"]


def test_timeout_dead_letters_frees_the_key_and_cascades(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("e1", "p1", caused_by="missing"), now=0)
    gate.offer(feed("e2", "p1"), now=1)
    gate.offer(feed("f", "p2", caused_by="e1"), now=2)  # waits on e1, which will never take effect
    assert gate.next_deadline() == 10.0
    gate.expire(9.9)
    assert not gate.drain()
    gate.expire(10.0)
    out = gate.drain()
    assert dead(out) == [("e1", CAUSE_MISSING), ("f", CAUSE_MISSING)]
    assert "'missing' did not take effect within 10 s" in out.dead[0].detail
    assert "was dead-lettered" in out.dead[1].detail
    assert ids(out.ready) == ["e2"]  # the key is free again
    assert gate.parked_count == 0 and gate.next_deadline() is None


def test_expiring_names_the_partitions_of_exactly_the_waits_expire_would_dead_letter(
    gate: CausalGate, feed: Feed
) -> None:
    """What the worker fences before a timed decision: the partitions of parked events due to
    expire for their own missing cause (not effects that would follow them, not events waiting
    only behind their key), and nothing before any deadline."""
    gate.offer(feed("e1", "p1", caused_by="missing"), now=0)
    gate.offer(feed("e2", "p1", caused_by="c"), now=0)  # behind e1 on its key; its cause lands
    gate.offer(feed("f", "p2", caused_by="e1", partition=1), now=2)  # follows e1's fate
    gate.offer(feed("g", "p3", caused_by="late", partition=2), now=4)
    for n in range(20):  # a heap with more than one level
        gate.offer(feed(f"x{n}", f"q{n}", caused_by=f"m{n}", partition=3), now=50 + n)
    gate.learn_applied([("w1", "c")])
    assert gate.expiring(9.9) == set()
    assert gate.expiring(10.0) == {(OBJECTS, 0)}  # e1 alone: e2 only waits behind it, f not yet due
    assert gate.expiring(12.0) == {(OBJECTS, 0), (OBJECTS, 1)}  # f's own deadline (12) is due too
    assert gate.expiring(14.0) == {(OBJECTS, 0), (OBJECTS, 1), (OBJECTS, 2)}
    gate.expire(14.0)
    assert sorted(dead(gate.drain())) == [("e1", CAUSE_MISSING), ("f", CAUSE_MISSING), ("g", CAUSE_MISSING)]
    assert gate.expiring(14.0) == set() and gate.expiring(65.0) == {(OBJECTS, 3)}


def test_an_event_waiting_only_on_its_key_does_not_time_out(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("e1", "p1", caused_by="c"), now=0)
    gate.offer(feed("e2", "p1"), now=5)
    gate.learn_applied([("w1", "c")])
    assert ids(gate.drain().ready) == ["e1", "e2"]
    gate.offer(feed("e3", "p1", caused_by="c2"), now=6)
    gate.offer(feed("e4", "p1"), now=6)
    gate.expire(100)
    out = gate.drain()
    assert dead(out) == [("e3", CAUSE_MISSING)] and ids(out.ready) == ["e4"]


def test_a_wait_whose_cause_may_still_be_unread_outlasts_the_wall_clock_until_read_time_passes(
    gate: CausalGate, feed: Feed
) -> None:
    """A worker behind: the effect was read at record time 1,000 s, but reading elsewhere stands at
    1,005 s, so its cause may be unread. Wall time past the timeout alone does not dead-letter it
    (before 2026-12-02 early morning it did: 93k valid effects in a soak); read time past
    1,000 + 10 s does, and a cause that arrives first releases it."""
    gate.offer(feed("e", "p1", caused_by="c"), now=0, at=1_000.0)
    gate.offer(feed("f", "p2", caused_by="d"), now=0, at=1_000.0)
    gate.expire(20.0, read_time=1_005.0)
    assert gate.expiring(20.0, read_time=1_005.0) == set()
    assert not gate.drain() and gate.parked_count == 2
    gate.offer(feed("c", "p3", partition=1), now=21.0)  # e's cause, read at last
    assert ids(gate.drain().ready) == ["c", "e"]
    assert gate.expiring(22.0, read_time=1_010.0) == {(OBJECTS, 0)}
    gate.expire(22.0, read_time=1_010.0)
    out = gate.drain()
    assert dead(out) == [("f", CAUSE_MISSING)] and gate.parked_count == 0


def test_a_wait_read_time_has_passed_still_waits_out_its_wall_clock(gate: CausalGate, feed: Feed) -> None:
    """Read time alone does not expire either: a worker catching up reads an hour of records in
    seconds, and the cause may be a poll away."""
    gate.offer(feed("e", "p1", caused_by="c"), now=0, at=1_000.0)
    gate.expire(9.0, read_time=5_000.0)
    assert gate.expiring(9.0, read_time=5_000.0) == set() and not gate.drain()
    gate.expire(10.0, read_time=5_000.0)
    assert dead(gate.drain()) == [("e", CAUSE_MISSING)]


def test_a_caught_up_quiet_worker_expires_on_the_timeout_as_before(gate: CausalGate, feed: Feed) -> None:
    """Every partition read to its high watermark: read time is now, so the wall clock decides."""
    reading = ReadTime()
    reading.assigned({(OBJECTS, 0), (LINKS, 0)})
    reading.read((OBJECTS, 0), 41, 1_000_000)  # the effect's record, at 1,000 s
    reading.fetched((OBJECTS, 0), 42, 42)
    reading.fetched((LINKS, 0), 7, 7)
    gate.offer(feed("e", "p1", caused_by="never"), now=0, at=reading.at((OBJECTS, 0)))
    wall = 1_000.0
    gate.expire(9.9, read_time=reading.watermark(wall + 9.9))
    assert not gate.drain()
    gate.expire(10.0, read_time=reading.watermark(wall + 10.0))
    assert dead(gate.drain()) == [("e", CAUSE_MISSING)]


def test_a_wait_moved_to_read_time_that_only_waits_behind_its_key_is_kept() -> None:
    gate, feed = CausalGate(timeout_s=10.0, max_parked=100), Feed()
    gate.offer(feed("e1", "p1", caused_by="c"), now=0, at=100.0)
    gate.offer(feed("e2", "p1", caused_by="d"), now=0, at=100.0)
    gate.expire(10.0, read_time=105.0)  # both wait on read time now
    gate.learn_applied([("w1", "d")])  # e2 now waits only behind e1
    gate.expire(11.0, read_time=110.0)
    out = gate.drain()
    assert dead(out) == [("e1", CAUSE_MISSING)] and ids(out.ready) == ["e2"]


def test_read_time_is_the_least_read_partition_now_for_those_read_to_their_end() -> None:
    reading = ReadTime()
    assert reading.watermark(50.0) == 50.0  # nothing assigned: nothing behind
    reading.assigned({(OBJECTS, 0), (OBJECTS, 1), (LINKS, 0)})
    assert reading.watermark(50.0) == UNKNOWN  # not fetched yet
    reading.fetched((OBJECTS, 0), 0, 0)  # empty partition: read to its end
    reading.read((OBJECTS, 1), 9, 20_000)
    reading.fetched((OBJECTS, 1), None, 500)  # 490 records still unread
    reading.read((LINKS, 0), 99, 45_000)
    reading.fetched((LINKS, 0), None, 100)
    assert reading.watermark(50.0) == 20.0 and reading.at((LINKS, 0)) == 45.0
    reading.read((OBJECTS, 1), 499, 44_000)
    reading.fetched((OBJECTS, 1), None, 500)
    assert reading.watermark(50.0) == 50.0
    reading.fetched((LINKS, 0), None, 130)  # new records on the broker: read time is the last read
    assert reading.watermark(50.0) == 45.0
    reading.assigned({(OBJECTS, 0), (OBJECTS, 1)})  # revoked: forgotten
    assert reading.watermark(50.0) == 50.0 and reading.at((LINKS, 0)) == UNKNOWN
    reading.assigned({(OBJECTS, 0), (OBJECTS, 1), (LINKS, 0)})  # assigned again: unknown until fetched
    assert reading.watermark(50.0) == UNKNOWN
    reading.read((LINKS, 0), 5, -1)  # no timestamp on the record: behind, time unknown
    reading.fetched((LINKS, 0), None, 130)
    assert reading.watermark(50.0) == UNKNOWN


def test_self_caused_is_rejected(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("a", "p1", caused_by="a"), now=0)
    assert dead(gate.drain()) == [("a", SELF_CAUSED)]


def test_two_cycle_is_dead_lettered(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("a", "p1", caused_by="b"), now=0)
    gate.offer(feed("b", "p2", caused_by="a"), now=0)
    out = gate.drain()
    assert sorted(dead(out)) == [("a", CAUSAL_CYCLE), ("b", CAUSAL_CYCLE)]
    assert "a -> b -> a" in out.dead[0].detail or "b -> a -> b" in out.dead[0].detail
    assert gate.parked_count == 0


def test_longer_cycle_and_its_dependents(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("a", "p1", caused_by="c"), now=0)
    gate.offer(feed("d", "p4", caused_by="a"), now=0)  # depends on the cycle, is not in it
    gate.offer(feed("b", "p2", caused_by="a"), now=0)
    gate.offer(feed("a2", "p1"), now=0)  # behind a on its key
    gate.offer(feed("c", "p3", caused_by="b"), now=0)
    out = gate.drain()
    assert sorted(dead(out)) == sorted(
        [("a", CAUSAL_CYCLE), ("b", CAUSAL_CYCLE), ("c", CAUSAL_CYCLE), ("d", CAUSE_MISSING)]
    )
    assert ids(out.ready) == ["a2"]


def test_deadlock_through_key_order_is_a_cycle(gate: CausalGate, feed: Feed) -> None:
    # A1 < A2 on key k1, B1 < B2 on key k2; A1 needs B2 and B1 needs A2: no order satisfies both.
    gate.offer(feed("A1", "k1", caused_by="B2"), now=0)
    gate.offer(feed("A2", "k1"), now=0)
    gate.offer(feed("B1", "k2", caused_by="A2"), now=0)
    gate.offer(feed("B2", "k2"), now=0)
    out = gate.drain()
    assert sorted(dead(out)) == [("A1", CAUSAL_CYCLE), ("B1", CAUSAL_CYCLE)]
    assert sorted(ids(out.ready)) == ["A2", "B2"]


def test_a_cause_in_another_world_does_not_count(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("c", "p1", world="w2"), now=0)
    gate.offer(feed("e", "p2", caused_by="c", world="w1"), now=0)
    out = gate.drain()
    assert ids(out.ready) == ["c"]
    assert gate.unknown_causes() == {("w1", "c")}
    gate.committed([("w2", "c")])
    gate.learn_applied([("w2", "c")])
    assert not gate.drain()
    gate.offer(feed("c", "p1", world="w1"), now=1)  # same id, its own world: now it counts
    assert ids(gate.drain().ready) == ["c", "e"]


def test_duplicates_of_parked_pending_and_applied_events(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("e", "p1", caused_by="c"), now=0)
    gate.offer(feed("x", "p2"), now=0)
    gate.drain()
    gate.offer(feed("e", "p1"), now=0)  # parked copy
    gate.offer(feed("x", "p2"), now=0)  # pending copy
    gate.committed([("w1", "x")])
    gate.offer(feed("x", "p2", partition=1), now=0)  # applied copy, on another partition
    out = gate.drain()
    assert ids(out.duplicates) == ["e", "x", "x"] and not out.ready


def test_a_parked_event_learned_applied_leaves_as_duplicate(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("e", "p1", caused_by="c"), now=0)
    gate.offer(feed("f", "p2", caused_by="e"), now=0)
    gate.learn_applied([("w1", "e")])  # another worker committed a copy of e
    out = gate.drain()
    assert ids(out.duplicates) == ["e"] and ids(out.ready) == ["f"]


def test_learning_about_our_own_pending_event_changes_nothing(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("c", "p1"), now=0)
    gate.offer(feed("e", "p2", caused_by="q"), now=0)
    assert gate.is_parked(("w1", "e")) and not gate.is_parked(("w1", "c"))
    gate.learn_applied([("w1", "c")])  # our own mark, read back before we reported the commit
    assert gate.pending_count == 1 and ids(gate.drain().ready) == ["c"]


def test_objects_and_links_with_the_same_pk_do_not_wait_on_each_other(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("o1", "x", caused_by="nope"), now=0)
    gate.offer(feed("l1", "x", topic=LINKS, kind=EntityKind.LINK), now=0)
    assert ids(gate.drain().ready) == ["l1"]


def test_full_signal_for_backpressure(feed: Feed) -> None:
    gate = CausalGate(timeout_s=1.0, max_parked=2)
    gate.offer(feed("a", "p1", caused_by="z"), now=0)
    assert not gate.full
    gate.offer(feed("b", "p2", caused_by="z"), now=0)
    assert gate.full
    gate.offer(feed("c", "p3", caused_by="z"), now=0)  # still accepted: the agent pauses fetching
    assert gate.parked_count == 3
    gate.learn_applied([("w1", "z")])
    assert not gate.full and ids(gate.drain().ready) == ["a", "b", "c"]


def test_revoke_drops_parked_events_of_the_partition_only(gate: CausalGate, feed: Feed) -> None:
    gate.offer(feed("c", "p1", caused_by="zz", partition=0), now=0)
    gate.offer(feed("c2", "p1", partition=0), now=0)
    gate.offer(feed("e", "p2", caused_by="c", partition=1), now=0)
    assert gate.revoke(("other", 0)) == 0
    assert gate.revoke((OBJECTS, 0)) == 2
    assert not gate.drain() and gate.parked_count == 1
    assert gate.unknown_causes() == {("w1", "c")}  # the new owner applies c; we learn it
    gate.learn_applied([("w1", "c")])
    assert ids(gate.drain().ready) == ["e"]


def test_constructor_checks() -> None:
    with pytest.raises(ValueError):
        CausalGate(timeout_s=0, max_parked=1)
    with pytest.raises(ValueError):
        CausalGate(timeout_s=1, max_parked=0)


def test_forgotten_applied_ids_are_asked_again(feed: Feed) -> None:
    gate = CausalGate(timeout_s=10.0, max_parked=10, remember_applied=1)
    gate.committed([("w1", "a"), ("w1", "b")])  # a is forgotten
    gate.offer(feed("e", "p1", caused_by="a"), now=0)
    assert gate.unknown_causes() == {("w1", "a")}
    gate.learn_applied([("w1", "a")])
    assert ids(gate.drain().ready) == ["e"]


# --- the gate, offsets, dedupe and batching together, through crashes ---------------------------

TIMEOUT = 5.0
MAX_PARKED = 5
CAUSE_KINDS = ("none", "none", "earlier", "earlier", "earlier", "missing", "other-world", "any")


@dataclass(frozen=True)
class Spec:
    """One produced event."""

    eid: str
    world: str
    pk: str
    version: int
    cause: str | None

    @property
    def ref(self) -> EventRef:
        return (self.world, self.eid)


@dataclass
class Workload:
    specs: list[Spec]
    logs: dict[int, list[Spec]]  # partition → records; the offset is the index


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    """Events with per-key versions, causal chains in any direction, producer retries, 3 partitions."""
    n = draw(st.integers(1, 14))
    keys = [(w, p) for w in ("w1", "w2") for p in ("a", "b", "c", "d")]
    partition_of = {k: draw(st.integers(0, 2)) for k in keys}
    specs: list[Spec] = []
    version: dict[tuple[str, str], int] = {}
    for i in range(n):
        world, pk = draw(st.sampled_from(keys))
        kind = draw(st.sampled_from(CAUSE_KINDS))
        cause: str | None = None
        if kind == "earlier" and i > 0:
            cause = draw(st.sampled_from([s.eid for s in specs if s.world == world] or ["nothing"]))
        elif kind == "missing":
            cause = f"missing{i}"
        elif kind == "other-world" and i > 0:
            cause = draw(st.sampled_from([s.eid for s in specs]))
        elif kind == "any":  # may point forward, at itself, or close a cycle
            cause = f"e{draw(st.integers(0, n - 1))}"
        version[(world, pk)] = version.get((world, pk), 0) + draw(st.integers(1, 2))
        specs.append(Spec(f"e{i}", world, pk, version[(world, pk)], cause))
    # publication: any interleaving that keeps each key's own order
    order = draw(st.permutations(range(n)))
    slots: dict[tuple[str, str], list[int]] = {}
    for pos, idx in enumerate(order):
        slots.setdefault((specs[idx].world, specs[idx].pk), []).append(pos)
    placed: list[Spec | None] = [None] * n
    for key, positions in slots.items():
        for pos, spec in zip(positions, [s for s in specs if (s.world, s.pk) == key], strict=True):
            placed[pos] = spec
    logs: dict[int, list[Spec]] = {0: [], 1: [], 2: []}
    for slot in placed:
        assert slot is not None
        logs[partition_of[(slot.world, slot.pk)]].append(slot)
    # producer retries: a copy lands later in the same partition
    for _ in range(draw(st.integers(0, 3))):
        spec = draw(st.sampled_from(specs))
        log = logs[partition_of[(spec.world, spec.pk)]]
        first = log.index(spec)
        log.insert(draw(st.integers(first + 1, len(log))), spec)
    return Workload(specs, logs)


actions = st.lists(
    st.one_of(
        st.tuples(st.just("poll"), st.integers(0, 2), st.integers(1, 4)),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 2.0, 6.0])),
        st.tuples(st.just("flush"), st.sampled_from(["ok", "before-commit", "after-commit", "after-mark"])),
        st.tuples(st.just("crash")),
        st.tuples(st.just("revoke"), st.integers(0, 2)),
    ),
    max_size=30,
)


class Crash(Exception):
    """kill -9: every in-memory structure is lost; the branch, Redis, DLQ and Kafka commits stay."""


@dataclass
class Durable:
    """What survives a crash: Kafka logs and committed offsets, branches, Redis marks, the DLQ."""

    logs: dict[int, list[Spec]]
    kafka: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0, 2: 0})
    branch: dict[str, list[Spec]] = field(default_factory=lambda: {"w1": [], "w2": []})
    marks: set[EventRef] = field(default_factory=set)
    last_commit: dict[str, list[EventRef]] = field(default_factory=dict)
    dlq: list[tuple[int, int, Spec, str]] = field(default_factory=list)


class Worker:
    """The change applier's decision loop with fake I/O, in the order of docs/architecture.md."""

    def __init__(self, durable: Durable, now: float) -> None:
        self.d = durable
        self.now = now
        self.tracker = OffsetTracker()
        self.gate = CausalGate(timeout_s=TIMEOUT, max_parked=MAX_PARKED)
        self.acc: BatchAccumulator[Arrival] = BatchAccumulator(max_events=3, max_seconds=1.0)
        self.pos: dict[int, int] = {}
        self.released: dict[tuple[str, str], tuple[int, int]] = {}  # order key → last (partition, offset)
        # start-up repair: the last commit of each branch may lack its Redis marks
        for refs in durable.last_commit.values():
            durable.marks.update(refs)
        for p in durable.logs:
            self.assign(p)

    def assign(self, p: int) -> None:
        self.tracker.assign((OBJECTS, p), self.d.kafka[p])
        self.pos[p] = self.d.kafka[p]

    def lookup(self, refs: Iterable[EventRef]) -> set[EventRef]:
        return {r for r in refs if r in self.d.marks}  # one pipelined EXISTS in the real agent

    def poll(self, p: int, count: int) -> None:
        if self.gate.full:
            return  # backpressure: the agent pauses fetching until timeouts or causes free room
        log = self.d.logs[p]
        start = self.pos[p]
        batch = []
        for off in range(start, min(start + count, len(log))):
            s = log[off]
            e = event(s.eid, s.pk, s.cause, world=s.world, version=s.version)
            batch.append(Arrival(e, Source(OBJECTS, p, off)))
            assert self.tracker.consumed((OBJECTS, p), off)
        self.pos[p] = start + len(batch)
        marked = self.lookup(refs_to_check(batch, self.gate.unknown_causes()))
        self.gate.learn_applied(marked)
        split = drop_duplicates(batch, marked)
        for a in split.duplicates:
            self.tracker.done(a.tp, a.offset)
        for a in split.fresh:
            self.gate.offer(a, self.now)
        self.handle(self.gate.drain())

    def handle(self, out: GateOutput) -> None:
        for a in out.ready:
            okey = (a.topic, a.event.key)
            assert a.offset > self.released.get(okey, (a.partition, -1))[1], "per-key order broken"
            self.released[okey] = (a.partition, a.offset)
            self.acc.add(a.event.world_id, a, self.now)
        for r in out.dead:
            self.d.dlq.append((r.arrival.partition, r.arrival.offset, self.spec(r.arrival), r.reason))
            self.tracker.done(r.arrival.tp, r.arrival.offset)
        for a in out.duplicates:
            self.tracker.done(a.tp, a.offset)

    def spec(self, a: Arrival) -> Spec:
        return self.d.logs[a.partition][a.offset]

    def tick(self, dt: float) -> None:
        self.now += dt
        self.gate.expire(self.now)
        self.gate.learn_applied(self.lookup(self.gate.unknown_causes()))
        self.handle(self.gate.drain())
        for world, batch in self.acc.take_due(self.now).items():
            self.commit(world, batch)

    def flush(self, crash_at: str = "ok") -> None:
        for world, batch in self.acc.take_all().items():
            self.commit(world, batch, crash_at)

    def commit(self, world: str, batch: list[Arrival], crash_at: str = "ok") -> None:
        stored: dict[tuple[str, str, str, str], int] = {}
        for s in self.d.branch[world]:
            stored[entity_ref(event(s.eid, s.pk, world=s.world))] = s.version
        decision = decide_versions(batch, stored)
        for st_ in decision.stale:  # dead letters are published before the commit
            a = st_.arrival
            self.d.dlq.append((a.partition, a.offset, self.spec(a), st_.reason))
        if crash_at == "before-commit":
            raise Crash
        settled = [a.ref for a in batch]
        self.d.branch[world].extend(self.spec(a) for a in decision.apply)
        self.d.last_commit[world] = settled
        if crash_at == "after-commit":
            raise Crash
        self.d.marks.update(settled)
        if crash_at == "after-mark":
            raise Crash
        self.gate.committed(settled)
        self.handle(self.gate.drain())
        for a in batch:
            self.tracker.done(a.tp, a.offset)
        self.ack()

    def ack(self) -> None:
        for (_, p), off in self.tracker.committable_all().items():
            assert off >= self.d.kafka[p], "committed offset went backwards"
            self.d.kafka[p] = off
        check_no_loss(self.d)

    def revoke(self, p: int) -> None:
        self.flush()  # on_partitions_revoked: finish what was released, then let go
        self.gate.revoke((OBJECTS, p))
        self.tracker.revoke((OBJECTS, p))
        self.released = {k: v for k, v in self.released.items() if v[0] != p}
        self.assign(p)  # the new owner (here: us again) starts from the committed offset


def settled(d: Durable, ref: EventRef) -> bool:
    return any(s.ref == ref for s in d.branch[ref[0]]) or any(s.ref == ref for *_, s, _ in d.dlq)


def check_no_loss(d: Durable) -> None:
    """Below each committed offset, every event is settled or has a copy that will be read again."""
    for p, log in d.logs.items():
        for s in log[: d.kafka[p]]:
            if settled(d, s.ref):
                continue
            again = any(
                s2.ref == s.ref and off >= d.kafka[p2] for p2, l2 in d.logs.items() for off, s2 in enumerate(l2)
            )
            assert again, f"committed offset of partition {p} passed {s.eid}, which is neither applied nor dead"


def run(w: Workload, steps: list[tuple]) -> Durable:
    d = Durable(w.logs)
    worker = Worker(d, 0.0)
    for step in steps:
        try:
            if step[0] == "poll":
                worker.poll(step[1], step[2])
            elif step[0] == "tick":
                worker.tick(step[1])
            elif step[0] == "flush":
                worker.flush(step[1])
                worker.ack()
            elif step[0] == "revoke":
                worker.revoke(step[1])
            else:
                raise Crash
        except Crash:
            worker = Worker(d, worker.now)
    for _ in range(12):  # then run to the end, with time passing for the timeouts
        for p, log in d.logs.items():
            worker.poll(p, len(log))
        worker.tick(TIMEOUT + 1)
        worker.flush()
        worker.ack()
    assert all(d.kafka[p] == len(log) for p, log in d.logs.items()), "a partition is stuck"
    assert worker.gate.parked_count == 0 and worker.gate.pending_count == 0
    return d


def check_outcome(w: Workload, d: Durable) -> None:
    by_ref = {s.ref: s for s in w.specs}
    copies = {s.ref for log in d.logs.values() for s in log if sum(x.ref == s.ref for x in log) > 1}
    for world, log in d.branch.items():
        refs = [s.ref for s in log]
        assert len(refs) == len(set(refs)), f"an event took effect twice in {world}"
        versions: dict[str, int] = {}
        for s in log:
            if s.cause is not None:  # the cause took effect before (possibly superseded by a newer version)
                cause = by_ref.get((world, s.cause))
                assert cause is not None, f"{s.eid} applied though its cause {s.cause} is not in {world}"
                assert versions.get(cause.pk, -1) >= cause.version, f"{s.eid} took effect before {s.cause}"
            assert s.version > versions.get(s.pk, -1), "per-key order broken on the branch"
            versions[s.pk] = s.version
    for s in w.specs:
        assert settled(d, s.ref), f"{s.eid} was lost"
    applied = {s.ref for log in d.branch.values() for s in log}
    for i, (*_, s, reason) in enumerate(d.dlq):
        if reason == STALE_VERSION:  # only a late copy (or redelivery) of an event that never took effect
            again = s.ref in copies or any(s2.ref == s.ref for *_, s2, _ in d.dlq[:i])
            assert again, f"{s.eid} stale though published once and never dead-lettered before"
            assert s.ref not in applied, f"a copy of {s.eid} got past dedupe after it took effect"
        assert reason in (CAUSE_MISSING, CAUSAL_CYCLE, SELF_CAUSED, STALE_VERSION)


@given(w=workloads(), steps=actions)
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_exactly_once_in_causal_order_through_crashes(w: Workload, steps: list[tuple]) -> None:
    check_outcome(w, run(w, steps))


def test_cross_partition_chain_published_backwards_with_a_crash_between_commit_and_mark() -> None:
    specs = [Spec("e0", "w1", "a", 1, None), Spec("e1", "w1", "b", 1, "e0"), Spec("e2", "w1", "c", 1, "e1")]
    w = Workload(specs, {0: [specs[2]], 1: [specs[1]], 2: [specs[0], specs[0]]})
    steps: list[tuple] = [
        ("poll", 0, 1),
        ("poll", 1, 1),
        ("poll", 2, 1),
        ("flush", "after-commit"),
        ("poll", 2, 2),
    ]
    d = run(w, steps)
    check_outcome(w, d)
    assert [s.eid for s in d.branch["w1"]] == ["e0", "e1", "e2"] and not d.dlq


def test_a_late_copy_is_stale_and_still_settles_its_effects() -> None:
    x = Spec("x", "w1", "a", 1, "c")  # waits for c, times out
    y = Spec("y", "w1", "a", 2, None)  # queued behind x, applied once x is dead-lettered
    c = Spec("c", "w1", "b", 1, None)
    z = Spec("z", "w1", "d", 1, "x")  # caused by x: x's copy is stale, its entity is already past it
    w = Workload([x, y, c, z], {0: [x, y, x], 1: [c], 2: [z]})
    steps: list[tuple] = [
        ("poll", 0, 2),
        ("tick", 6.0),
        ("flush", "ok"),
        ("poll", 1, 1),
        ("flush", "ok"),
        ("poll", 0, 1),
        ("flush", "ok"),
        ("poll", 2, 1),
    ]
    d = run(w, steps)
    check_outcome(w, d)
    assert [s.eid for s in d.branch["w1"]] == ["y", "c", "z"]
    assert [(s.eid, off, reason) for _, off, s, reason in d.dlq] == [
        ("x", 0, CAUSE_MISSING),
        ("x", 2, STALE_VERSION),
    ]


# --- the batch offer (``CausalGate.offer_all``): a fast path for events with no cause -------------------


def test_events_without_a_cause_on_free_keys_are_released_at_once_without_a_deadline() -> None:
    gate, feed = CausalGate(timeout_s=10.0, max_parked=100), Feed()
    parked = gate.offer_all([feed("a", "p1"), feed("b", "p2"), feed("c", "p1")], now=0)
    assert parked == []
    assert ids(gate.drain().ready) == ["a", "b", "c"]
    assert gate.pending_count == 3 and gate.next_deadline() is None


def test_an_event_without_a_cause_behind_a_parked_one_on_its_key_waits_and_is_reported_parked() -> None:
    gate, feed = CausalGate(timeout_s=10.0, max_parked=100), Feed()
    parked = gate.offer_all([feed("e", "p1", caused_by="c"), feed("f", "p1"), feed("g", "p2")], now=0)
    assert ids(parked) == ["e", "f"]
    assert ids(gate.drain().ready) == ["g"]
    # The cause arrives without a cause of its own: fast path, and it wakes what waits on it.
    assert gate.offer_all([feed("c", "p3")], now=1) == []
    assert ids(gate.drain().ready) == ["c", "e", "f"]


def test_copies_of_held_or_applied_events_are_duplicates_on_the_fast_path_too() -> None:
    gate, feed = CausalGate(timeout_s=10.0, max_parked=100), Feed()
    gate.learn_applied([("w1", "old")])
    gate.offer_all([feed("a", "p1"), feed("a", "p2"), feed("old", "p3")], now=0)
    out = gate.drain()
    assert ids(out.ready) == ["a"] and ids(out.duplicates) == ["a", "old"]


def test_with_nothing_parked_a_batch_is_released_without_building_order_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The order key is built only while something is parked: before, every event of every poll
    built one (then a formatted ``event.key``, hashed fresh, ~1 µs) to ask whether its key had a head."""
    gate, feed = CausalGate(timeout_s=10.0, max_parked=100), Feed()
    free = [feed(f"a{i}", f"p{i % 3}") for i in range(30)]
    parking = feed("e", "p1", caused_by="c")
    behind = [feed("f", "p1"), feed("g", "p2")]
    read: list[str] = []
    slot = ChangeEvent.__dict__["entity_pk"]  # the pk is read to build an order key, and only then

    def counting(ev: ChangeEvent) -> str:
        read.append(ev.event_id)
        return slot.__get__(ev)  # type: ignore[no-any-return]

    monkeypatch.setattr(ChangeEvent, "entity_pk", property(counting))
    assert gate.offer_all(free, now=0) == []
    assert len(gate.drain().ready) == 30 and read == []
    # Something parked: each event's order key is built, and one on the parked key waits.
    assert ids(gate.offer_all([parking], now=1)) == ["e"]
    read.clear()
    assert ids(gate.offer_all(behind, now=1)) == ["f"]
    assert set(read) == {"f", "g"} and ids(gate.drain().ready) == ["g"]


_steps = st.lists(
    st.tuples(
        st.sampled_from(["e0", "e1", "e2", "e3", "e4", "e5"]),  # event ids (repeats are copies)
        st.sampled_from(["p0", "p1", "p2"]),  # keys
        st.one_of(st.none(), st.sampled_from(["e0", "e1", "e2", "e3", "e4", "e5", "gone"])),  # causes
        st.integers(0, 1),  # partition
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(batches=st.lists(_steps, min_size=1, max_size=4), applied=st.sets(st.sampled_from(["e0", "e3", "gone"])))
def test_offer_all_equals_offering_one_by_one(batches: list[list[tuple]], applied: set[str]) -> None:
    one, many = CausalGate(timeout_s=5.0, max_parked=1_000), CausalGate(timeout_s=5.0, max_parked=1_000)
    for gate in (one, many):
        gate.learn_applied([("w1", i) for i in sorted(applied)])
    feed_one, feed_many = Feed(), Feed()
    for t, steps in enumerate(batches):
        arrivals_one = [feed_one(i, pk, cause, partition=p) for i, pk, cause, p in steps]
        arrivals_many = [feed_many(i, pk, cause, partition=p) for i, pk, cause, p in steps]
        parked_one: list[Arrival] = []
        for a in arrivals_one:
            held_before = one.is_parked(a.ref)  # then this one is a copy: a duplicate, not parked
            one.offer(a, now=t)
            if one.is_parked(a.ref) and not held_before:
                parked_one.append(a)
        parked_many = many.offer_all(arrivals_many, now=t)
        assert [(a.ref, a.offset) for a in parked_many] == [(a.ref, a.offset) for a in parked_one]
        for gate in (one, many):
            gate.expire(now=t + 3)
        a_out, b_out = one.drain(), many.drain()
        for part in ("ready", "duplicates"):
            got = [(x.ref, x.offset) for x in getattr(b_out, part)]
            assert got == [(x.ref, x.offset) for x in getattr(a_out, part)]
        assert [(r.arrival.offset, r.reason) for r in a_out.dead] == [(r.arrival.offset, r.reason) for r in b_out.dead]
        assert (one.parked_count, one.pending_count) == (many.parked_count, many.pending_count)
        assert one.unknown_causes() == many.unknown_causes()


def _committed_one_by_one(gate: CausalGate, refs: list[EventRef]) -> None:
    """``CausalGate.committed`` as it was before it took a batch in one pass (the reference)."""
    for ref in refs:
        gate._pending.pop(ref, None)  # noqa: SLF001
        gate._remember_applied(ref)  # noqa: SLF001
        gate._wake(ref)  # noqa: SLF001
    gate._run()  # noqa: SLF001


@settings(max_examples=300, deadline=None)
@given(
    steps=_steps,
    commits=st.lists(st.lists(st.sampled_from(["e0", "e1", "e2", "e3", "e4", "e5", "x"]), max_size=6), max_size=4),
    remember=st.integers(1, 8),
)
def test_committing_a_batch_in_one_pass_equals_one_ref_at_a_time(
    steps: list[tuple], commits: list[list[str]], remember: int
) -> None:
    one = CausalGate(timeout_s=5.0, max_parked=1_000, remember_applied=remember)
    many = CausalGate(timeout_s=5.0, max_parked=1_000, remember_applied=remember)
    feed_one, feed_many = Feed(), Feed()
    one.offer_all([feed_one(i, pk, cause, partition=p) for i, pk, cause, p in steps], now=0)
    many.offer_all([feed_many(i, pk, cause, partition=p) for i, pk, cause, p in steps], now=0)
    for t, batch in enumerate(commits, start=1):
        refs = [("w1", i) for i in batch]
        _committed_one_by_one(one, refs)
        many.committed(refs)
        a_out, b_out = one.drain(), many.drain()
        assert [(x.ref, x.offset) for x in b_out.ready] == [(x.ref, x.offset) for x in a_out.ready]
        assert list(many._applied) == list(one._applied)  # noqa: SLF001 - the same cache, same order
        assert (one.parked_count, one.pending_count) == (many.parked_count, many.pending_count)
        assert one.unknown_causes() == many.unknown_causes()
        one.expire(now=t * 3)
        many.expire(now=t * 3)


def test_held_back_only_the_partitions_read_ahead_pause_and_past_the_ceiling_all() -> None:
    """The soak's stall (2026-12-02): pausing every partition while parked events held reading
    back also paused the partitions behind that hold their causes."""
    parts = [(OBJECTS, 0), (OBJECTS, 1), (LINKS, 0), (LINKS, 1)]
    times = {(OBJECTS, 0): 100.0, (OBJECTS, 1): 103.0, (LINKS, 0): 400.0, (LINKS, 1): 900.0}
    assert to_pause(parts, times, held_back=True, ceiling=False) == {(LINKS, 0), (LINKS, 1)}
    assert to_pause(parts, times, held_back=False, ceiling=False) == set()
    assert to_pause(parts, times, held_back=True, ceiling=True) == set(parts)  # the hard bound
    assert to_pause(parts, times, held_back=False, ceiling=True) == set(parts)  # commits lagging
    # Not read yet (unknown, or not in the read times): least read, kept; the others wait for it.
    assert to_pause(parts, {**times, (OBJECTS, 1): UNKNOWN}, held_back=True, ceiling=False) == {
        (OBJECTS, 0),
        (LINKS, 0),
        (LINKS, 1),
    }
    assert to_pause(parts, {}, held_back=True, ceiling=False) == set()
