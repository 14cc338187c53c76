"""The causal gate: releases events so that a cause takes effect before its effects and keys keep order.

Rules (issue 5, BRIEF guarantee 3):

- An event whose ``caused_by`` has not taken effect is *parked*. Later events of the same key queue
  behind it (per-key FIFO), whether or not they have a cause of their own.
- A cause *takes effect* when it is released here (then it is *pending*: it sits in a batch ahead of
  anything released after it, so its effects may share its commit, after it), or when the agent
  reports it applied: ``committed`` for our own batches, ``learn_applied`` for what Redis says other
  workers applied. Ask Redis about ``unknown_causes()`` in the same round trip as dedupe.
- A parked event still waiting for its cause ``timeout_s`` after it arrived is dead-lettered with
  ``cause-missing``; that frees its key, and events parked on *it* as their cause are dead-lettered
  too (their cause will never take effect here). ``caused_by == event_id`` is ``self-caused``.
- The timeout counts in *read time* as well as in wall time (2026-12-02 early morning): an event
  read at record time ``T`` (``at``) expires only once wall time ``timeout_s`` after it was parked
  has passed *and* the intake's read time (``read_time``: how far the worker has read every one of
  its partitions, ``agents.readtime``) has passed ``T + timeout_s``. A worker behind reads some
  partitions minutes behind others; a cause still unread there is late, not missing. The caller
  passes ``read_time=inf`` where reading cannot move (nothing known, or every partition paused by
  the parked events themselves past memory's hard bound), which is the wall-time rule alone.
- Cycles are ``causal-cycle``: the gate keeps a wait-for graph (an event waits for its cause and for
  the event ahead of it on its key). A new parked event can only close a cycle through itself, so it
  is searched for then, and only when something already waits on the new event. Every event whose
  *cause* edge lies on the cycle is dead-lettered (A↔B: both; a deadlock through key order such as
  A1→B2, B1→A2 with A1<A2 and B1<B2 on their keys: A1 and B1), which breaks it.
- Causes are per world: ``caused_by`` names an event id in the effect's own world. Each world is its
  own branch, an event id may exist in several worlds (forks), and a commit on one branch says nothing
  about another, so a cause applied in another world does not count (the effect waits, then
  ``cause-missing``).
- Per-key order is per topic: the ordering key is (topic, ``event.key``), Kafka's own ordering domain.
  An object and a link that share a pk must not wait on each other (it could fake a cycle).
- Memory: ``full`` is true at ``max_parked`` parked events; the agent then pauses fetching (offers are
  still accepted, so the overshoot is at most one fetched batch). Applied ids are remembered in a
  bounded cache; a forgotten one is asked again through ``unknown_causes``, so forgetting costs a lookup,
  never correctness.
- ``revoke`` drops parked events of a partition silently (the new owner re-reads them). Released but
  uncommitted events are not taken back: the agent flushes before giving a partition up, or drops the
  whole gate on a failed flush and restarts from the committed offsets.

Time is passed in (``now``, monotonic, never decreasing). No I/O.

Wiring, per fetched batch (``OffsetTracker`` and ``agents.dedupe`` do the rest)::

    refs = refs_to_check(arrivals, gate.unknown_causes())     # one pipelined Redis EXISTS
    marked = {ref for ref, hit in zip(refs, answers) if hit}
    gate.learn_applied(marked)                                # all of them, not only unknown causes
    split = drop_duplicates(arrivals, marked)                 # split.duplicates: offsets done now
    for a in split.fresh: gate.offer(a, now)
    out = gate.drain()   # ready → batch of its world; dead → DLQ, then done; duplicates → done
    # on a timer: gate.expire(now, read_time), ask about gate.unknown_causes(), drain again
    # flush: decide_versions → DLQ the stale ones → Nessie commit → SET marks → gate.committed(all
    #        refs of the batch, stale included) → done(all offsets) → commit tracker offsets to Kafka
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from agents.offset_tracker import Arrival, EventRef
from sinks.committed_offsets import PartitionId

CAUSE_MISSING = "cause-missing"
CAUSAL_CYCLE = "causal-cycle"
SELF_CAUSED = "self-caused"

OrderKey = tuple[str, str, str]
"""(topic, world_id, pk): events with the same order key are released in arrival order. The
event's key ``"<world_id>::<pk>"`` split in two (a world id holds no ``:``, so the split is the
same relation): the formatted key was a new string a event, hashed fresh, ~0.5 µs."""

_CAUSE = "cause"
_KEY = "key"


@dataclass(frozen=True, slots=True)
class Rejected:
    """An event the gate dead-letters: ``reason`` is the stable code for the DLQ headers."""

    arrival: Arrival
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class GateOutput:
    """What happened since the last drain, in order.

    ``ready``: events to append to their world's batch in this order (causes before effects, per-key
    order kept); they are pending until ``committed``. ``dead``: publish to the DLQ, then mark their
    offsets done. ``duplicates``: copies of an event already held or applied; mark their offsets done.
    """

    ready: list[Arrival] = field(default_factory=list)
    dead: list[Rejected] = field(default_factory=list)
    duplicates: list[Arrival] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.ready or self.dead or self.duplicates)


@dataclass(eq=False, slots=True)
class _Parked:
    arrival: Arrival
    ref: EventRef
    cause: EventRef | None
    order_key: OrderKey
    arrived_at: float
    seq: int
    at: float  # record time it was read at (Unix seconds); -inf: not known, wall time alone decides
    prev: _Parked | None = None  # the event ahead on the same order key
    next: _Parked | None = None


class CausalGate:
    """Parks, orders and releases events by their causes and keys; see the module doc for the rules."""

    def __init__(self, timeout_s: float, max_parked: int, remember_applied: int | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if max_parked < 1:
            raise ValueError("max_parked must be at least 1")
        self.timeout_s = timeout_s
        self.max_parked = max_parked
        self._remember = remember_applied if remember_applied is not None else max(max_parked, 10_000)
        self._parked: dict[EventRef, _Parked] = {}
        self._heads: dict[OrderKey, _Parked] = {}
        self._tails: dict[OrderKey, _Parked] = {}
        self._by_cause: dict[EventRef, dict[int, _Parked]] = {}
        self._pending: dict[EventRef, Arrival] = {}
        self._applied: OrderedDict[EventRef, None] = OrderedDict()
        # Wall-time deadlines; an entry due there whose read time is not yet due moves to
        # ``_read_deadlines`` (keyed by record time + timeout), so each heap is walked only where due.
        self._deadlines: list[tuple[float, int, EventRef]] = []
        self._read_deadlines: list[tuple[float, int, EventRef]] = []
        self._seq = 0
        self._work: deque[OrderKey] = deque()
        self._ready: list[Arrival] = []
        self._dead: list[Rejected] = []
        self._dups: list[Arrival] = []

    # --- inputs -----------------------------------------------------------------------------------

    def offer(self, arrival: Arrival, now: float, at: float = float("-inf")) -> None:
        """Take one event (after Redis dedupe), in arrival order; results come out of ``drain``.
        ``at``: the record time it was read at (see the module doc), for its read-time deadline."""
        ref = arrival.ref
        if ref in self._parked or ref in self._pending or ref in self._applied:
            self._dups.append(arrival)
            return
        event = arrival.event
        if event.caused_by == event.event_id:
            self._dead.append(Rejected(arrival, SELF_CAUSED, "caused_by names the event itself"))
            return
        cause = (event.world_id, event.caused_by) if event.caused_by is not None else None
        order_key = (arrival.source.topic, event.world_id, event.entity_pk)
        if order_key not in self._heads and self._satisfied(cause):
            self._release(arrival)
            self._run()
            return
        self._seq += 1
        entry = _Parked(arrival, ref, cause, order_key, now, self._seq, at)
        self._park(entry)
        heapq.heappush(self._deadlines, (now + self.timeout_s, entry.seq, ref))
        if self._by_cause.get(ref):
            self._break_cycles(entry)
        self._run()

    def offer_all(
        self, arrivals: Iterable[Arrival], now: float, at: Callable[[PartitionId], float] | None = None
    ) -> list[Arrival]:
        """``offer`` each event in order; returns the ones left parked (in arrival order).

        Fast path (issue 13): an event with no ``caused_by`` whose key has nothing parked, and that
        is not a copy of one held or applied, is released on the spot: no parking, no deadline, no
        wait-for search, and its wake-up is skipped when nothing waits on it. Anything else goes
        through ``offer``. The result is the same as offering the events one by one. ``at``: the
        record time read so far on a partition, asked only for events that go through ``offer``.
        """
        parked: list[Arrival] = []
        heads, pending, applied, held = self._heads, self._pending, self._applied, self._parked
        ready, by_cause = self._ready, self._by_cause
        for arrival in arrivals:
            event = arrival.event
            ref = arrival.ref
            # With nothing parked (most polls) no key has a head, no event is held and none waits
            # on ``ref``: the order key is built only when something is parked. ``heads`` is read
            # per event: an offer below may park one.
            if (
                event.caused_by is None
                and (
                    not heads
                    or ((arrival.source.topic, event.world_id, event.entity_pk) not in heads and ref not in held)
                )
                and ref not in pending
                and ref not in applied
            ):
                ready.append(arrival)
                pending[ref] = arrival
                if by_cause and ref in by_cause:
                    self._wake(ref)
                    self._run()
                continue
            self.offer(arrival, now, at(arrival.tp) if at is not None else float("-inf"))
            if ref in held and held[ref].arrival is arrival:
                parked.append(arrival)
        return parked

    def learn_applied(self, refs: Iterable[EventRef]) -> None:
        """Events known to have taken effect elsewhere (Redis marks): their effects may go.

        A parked event learned applied is a copy of one another worker committed: it leaves as a
        duplicate.
        """
        for ref in refs:
            if ref in self._pending:
                continue
            entry = self._parked.get(ref)
            if entry is not None:
                self._unpark(entry)
                self._dups.append(entry.arrival)
            self._remember_applied(ref)
            self._wake(ref)
        self._run()

    def committed(self, refs: Iterable[EventRef]) -> None:
        """Released events whose batch is now committed (or settled by the version rule).

        Once per batch of a commit (thousands of refs): ``_remember_applied`` and ``_wake`` inlined,
        the applied cache trimmed once at the end (the same entries survive: the newest ones).
        """
        pending, applied, by_cause = self._pending, self._applied, self._by_cause
        for ref in refs:
            pending.pop(ref, None)
            if ref in applied:
                applied.move_to_end(ref)
            else:
                applied[ref] = None  # a new key goes last already: no move (~0.1 µs an event)
            if by_cause and ref in by_cause:
                self._wake(ref)
        while len(applied) > self._remember:
            applied.popitem(last=False)
        self._run()

    def abandoned(self, refs: Iterable[EventRef]) -> None:
        """Released events that did not take effect after all (dead-lettered at commit time, or
        found settled without being on the branch): they stop counting as causes, and a later copy
        (a redrive) is taken as new. Their effects still waiting stay parked."""
        for ref in refs:
            self._pending.pop(ref, None)
        self._run()

    def expire(self, now: float, read_time: float = float("inf")) -> None:
        """Dead-letter parked events still waiting for their cause: ``timeout_s`` of wall time
        since they were parked and ``read_time`` past their record time + ``timeout_s``."""
        wall, by_read = self._deadlines, self._read_deadlines
        while wall and wall[0][0] <= now:
            _, seq, ref = heapq.heappop(wall)
            entry = self._live(seq, ref)
            if entry is None:
                continue
            if self._satisfied(entry.cause):
                # Only waiting behind its key: the events ahead expire first. Keep a deadline anyway,
                # in case its cause drops out of the bounded applied cache before it gets to the head.
                heapq.heappush(wall, (now + self.timeout_s, seq, ref))
            elif entry.at + self.timeout_s > read_time:
                heapq.heappush(by_read, (entry.at + self.timeout_s, seq, ref))  # its cause may be unread
            else:
                self._reject([(entry, CAUSE_MISSING, self._missing(entry))])
        while by_read and by_read[0][0] <= read_time:
            _, seq, ref = heapq.heappop(by_read)
            entry = self._live(seq, ref)
            if entry is None:
                continue
            if self._satisfied(entry.cause):
                heapq.heappush(wall, (now + self.timeout_s, seq, ref))
            else:
                self._reject([(entry, CAUSE_MISSING, self._missing(entry))])
        self._run()

    def _missing(self, entry: _Parked) -> str:
        assert entry.cause is not None
        return f"cause {entry.cause[1]!r} did not take effect within {self.timeout_s:g} s"

    def _live(self, seq: int, ref: EventRef) -> _Parked | None:
        """The parked entry a deadline belongs to, or None when it left (or was parked again)."""
        entry = self._parked.get(ref)
        return entry if entry is not None and entry.seq == seq else None

    def expiring(self, now: float, read_time: float = float("inf")) -> set[PartitionId]:
        """The partitions of the parked events ``expire(now, read_time)`` would dead-letter (their
        own expiry, not the effects that follow them): a decision made by the clock, which the
        worker fences by group membership first. Walks only the due part of the deadline heaps."""
        out: set[PartitionId] = set()
        for entry in self._due(self._deadlines, now):
            if entry.at + self.timeout_s <= read_time:
                out.add(entry.arrival.tp)
        out.update(entry.arrival.tp for entry in self._due(self._read_deadlines, read_time))
        return out

    def _due(self, heap: list[tuple[float, int, EventRef]], limit: float) -> Iterator[_Parked]:
        """Live entries of ``heap`` due by ``limit`` whose cause has not taken effect."""
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            deadline, seq, ref = heap[i]
            if deadline > limit:
                continue  # a heap: nothing below it is due either
            entry = self._live(seq, ref)
            if entry is not None and not self._satisfied(entry.cause):
                yield entry
            stack.extend(j for j in (2 * i + 1, 2 * i + 2) if j < len(heap))

    def revoke(self, tp: PartitionId) -> int:
        """Drop the parked events read from ``tp`` (no dead letters); returns how many were dropped."""
        gone = [e for e in self._parked.values() if e.arrival.tp == tp]
        for entry in gone:
            self._unpark(entry)
        self._run()
        return len(gone)

    # --- outputs ----------------------------------------------------------------------------------

    def drain(self) -> GateOutput:
        """Everything released, rejected or found duplicate since the last drain."""
        out = GateOutput(self._ready, self._dead, self._dups)
        self._ready, self._dead, self._dups = [], [], []
        return out

    def unknown_causes(self) -> set[EventRef]:
        """Causes parked events wait for that are not known to have taken effect: ask Redis."""
        return {cause for cause, waiters in self._by_cause.items() if waiters and not self._satisfied(cause)}

    def next_deadline(self) -> float | None:
        """The earliest wall time ``expire`` may dead-letter something, or None (an entry already
        past it and waiting on read time is due now: its wall deadline is behind us)."""
        if any(self._live(seq, ref) is not None for _, seq, ref in self._read_deadlines):
            return float("-inf")
        heap = self._deadlines
        while heap:
            _, seq, ref = heap[0]
            if self._live(seq, ref) is not None:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    @property
    def full(self) -> bool:
        """True when ``max_parked`` events are parked: pause fetching until it clears."""
        return len(self._parked) >= self.max_parked

    @property
    def parked_count(self) -> int:
        return len(self._parked)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def is_parked(self, ref: EventRef) -> bool:
        return ref in self._parked

    # --- internals --------------------------------------------------------------------------------

    def _satisfied(self, cause: EventRef | None) -> bool:
        return cause is None or cause in self._pending or cause in self._applied

    def _remember_applied(self, ref: EventRef) -> None:
        self._applied[ref] = None
        self._applied.move_to_end(ref)
        while len(self._applied) > self._remember:
            self._applied.popitem(last=False)

    def _park(self, entry: _Parked) -> None:
        self._parked[entry.ref] = entry
        tail = self._tails.get(entry.order_key)
        if tail is None:
            self._heads[entry.order_key] = entry
        else:
            tail.next = entry
            entry.prev = tail
        self._tails[entry.order_key] = entry
        if entry.cause is not None:
            self._by_cause.setdefault(entry.cause, {})[entry.seq] = entry

    def _unpark(self, entry: _Parked) -> None:
        """Remove a parked entry from every index; a new head of its key is checked for release."""
        del self._parked[entry.ref]
        if entry.cause is not None:
            waiters = self._by_cause.get(entry.cause)
            if waiters is not None:
                waiters.pop(entry.seq, None)
                if not waiters:
                    del self._by_cause[entry.cause]
        key = entry.order_key
        if entry.prev is None:
            if entry.next is None:
                del self._heads[key]
            else:
                self._heads[key] = entry.next
                self._work.append(key)
        else:
            entry.prev.next = entry.next
        if entry.next is None:
            if entry.prev is None:
                self._tails.pop(key, None)
            else:
                self._tails[key] = entry.prev
        else:
            entry.next.prev = entry.prev
        entry.prev = entry.next = None

    def _release(self, arrival: Arrival) -> None:
        self._ready.append(arrival)
        self._pending[arrival.ref] = arrival
        self._wake(arrival.ref)

    def _wake(self, ref: EventRef) -> None:
        """Queue the keys whose head was waiting for ``ref``."""
        for waiter in self._by_cause.get(ref, {}).values():
            if waiter.prev is None:
                self._work.append(waiter.order_key)

    def _run(self) -> None:
        """Release key heads whose cause took effect, until nothing more moves."""
        while self._work:
            head = self._heads.get(self._work.popleft())
            while head is not None and self._satisfied(head.cause):
                nxt = head.next
                self._unpark(head)
                self._release(head.arrival)
                head = nxt

    def _reject(self, items: list[tuple[_Parked, str, str]]) -> None:
        """Dead-letter entries, then everything parked on them as its cause (``cause-missing``)."""
        todo = deque(items)
        while todo:
            entry, reason, detail = todo.popleft()
            if self._parked.get(entry.ref) is not entry:
                continue
            self._unpark(entry)
            self._dead.append(Rejected(entry.arrival, reason, detail))
            for waiter in list(self._by_cause.get(entry.ref, {}).values()):
                why = f"its cause {entry.ref[1]!r} was dead-lettered ({reason})"
                todo.append((waiter, CAUSE_MISSING, why))

    def _edges(self, entry: _Parked) -> list[tuple[str, _Parked]]:
        """What a parked entry waits for, among parked entries: the one ahead on its key, its cause."""
        out: list[tuple[str, _Parked]] = []
        if entry.prev is not None:
            out.append((_KEY, entry.prev))
        if entry.cause is not None:
            cause = self._parked.get(entry.cause)
            if cause is not None:
                out.append((_CAUSE, cause))
        return out

    def _find_cycle(self, start: _Parked) -> list[tuple[_Parked, str]] | None:
        """A wait-for cycle through ``start`` as (entry, kind of its edge on the cycle), or None."""
        parent: dict[int, tuple[_Parked, str]] = {}
        seen = {start.seq}
        stack = [start]
        while stack:
            node = stack.pop()
            for kind, nxt in self._edges(node):
                if nxt is start:
                    cycle = [(node, kind)]
                    while node is not start:
                        node, kind = parent[node.seq]
                        cycle.append((node, kind))
                    cycle.reverse()
                    return cycle
                if nxt.seq not in seen:
                    seen.add(nxt.seq)
                    parent[nxt.seq] = (node, kind)
                    stack.append(nxt)
        return None

    def _break_cycles(self, entry: _Parked) -> None:
        """Dead-letter the cause-holders of every wait-for cycle the new ``entry`` closed."""
        while self._parked.get(entry.ref) is entry and self._by_cause.get(entry.ref):
            cycle = self._find_cycle(entry)
            if cycle is None:
                return
            ids = " -> ".join(e.ref[1] for e, _ in cycle)
            culprits = [
                (e, CAUSAL_CYCLE, f"caused_by closes a cycle of waits: {ids} -> {cycle[0][0].ref[1]}"[:900])
                for e, kind in cycle
                if kind == _CAUSE
            ]
            self._reject(culprits)
