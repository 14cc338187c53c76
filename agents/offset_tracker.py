"""Per-partition ack tracking: which Kafka offset may be committed while events finish out of order.

An offset is *done* once its event is committed to Nessie, dead-lettered, or dropped as a duplicate of
an event that is itself held back elsewhere. Events finish in any order (a parked event waits while
later ones commit), but Kafka only stores one position per partition, so the committable offset is the
first offset consumed and not yet done: a parked event holds its partition back (BRIEF, Traps).

Offsets follow Kafka's convention: the committed offset is the *next* offset to read. Offsets that
were never consumed (compacted away, transaction markers) are gaps: anything below the highest consumed
offset that was never seen does not exist, so it never holds the partition back.

The range helpers record an exact set of offsets (with gaps) compactly, for commit metadata on the
branch: a per-partition high-water mark is not enough to tell what a commit covered.

No I/O: the agent feeds consumption and completion in, and reads committable offsets out.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from models.events import ChangeEvent
from sinks.committed_offsets import PartitionId, Source

EventRef = tuple[str, str]
"""(world_id, event_id): the identity of an event. Event ids are unique per world, not globally."""

OffsetRange = tuple[int, int]
"""A half-open range ``[start, end)`` of offsets."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """One decoded event and where it was read from; the unit the gate, dedupe and batcher pass around."""

    event: ChangeEvent
    source: Source
    #: ``(world_id, event_id)``, kept: dedupe, the gate and the flush ask for it ~5 times an event
    #: (a property built the tuple each time). Derived, so not compared.
    ref: EventRef = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ref", (self.event.world_id, self.event.event_id))

    @property
    def topic(self) -> str:
        return self.source.topic

    @property
    def partition(self) -> int:
        return self.source.partition

    @property
    def offset(self) -> int:
        return self.source.offset

    @property
    def tp(self) -> PartitionId:
        return (self.source.topic, self.source.partition)


class _ArrivalDraft:
    """A mutable twin of :class:`Arrival` (the same slots) that becomes one by a class assignment,
    as ``models.events.new_event`` does for events: the frozen ``__init__`` sets each field through
    ``object.__setattr__`` (~1.0-1.4 µs an arrival, one per polled event, against ~0.7)."""

    __slots__ = Arrival.__slots__

    def __init__(self, event: ChangeEvent, source: Source) -> None:
        self.event = event
        self.source = source
        self.ref = (event.world_id, event.event_id)


def arrival(event: ChangeEvent, source: Source) -> Arrival:
    """``Arrival(event, source)``, built through :class:`_ArrivalDraft` (the intake's one per event)."""
    draft = _ArrivalDraft(event, source)
    draft.__class__ = Arrival  # type: ignore[assignment]
    return draft  # type: ignore[return-value]


class _SourceDraft:
    """A mutable twin of :class:`Source`, as :class:`_ArrivalDraft` is of ``Arrival``: the frozen
    ``__init__`` of its 3 fields cost ~1 µs a polled event, the twin ~0.3."""

    __slots__ = Source.__slots__

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset


def arrival_at(event: ChangeEvent, topic: str, partition: int, offset: int) -> Arrival:
    """``Arrival(event, Source(topic, partition, offset))``, both built through their twins."""
    src = _SourceDraft(topic, partition, offset)
    src.__class__ = Source  # type: ignore[assignment]
    draft = _ArrivalDraft(event, src)  # type: ignore[arg-type]
    draft.__class__ = Arrival  # type: ignore[assignment]
    return draft  # type: ignore[return-value]


class _Partition:
    """In-flight offsets of one partition, in consumption (= offset) order."""

    __slots__ = ("queue", "inflight", "done", "position", "generation")

    def __init__(self, position: int | None, generation: int | None = None) -> None:
        self.queue: deque[int] = deque()  # consumed offsets, ascending; front may be done
        self.inflight: set[int] = set()  # consumed and not yet done
        self.done: set[int] = set()  # done, but still in the queue behind an in-flight offset
        self.position = position  # next offset after the highest consumed (or the assigned start)
        self.generation = generation  # the consumer-group generation it was assigned in, if known


def _advance(part: _Partition) -> None:
    """Drop the done offsets at the front of a partition's queue (its committable offset moves)."""
    queue, done = part.queue, part.done
    while queue and queue[0] in done:
        done.discard(queue.popleft())


class OffsetTracker:
    """Tracks consumed and done offsets per partition and answers the committable offset of each.

    Contract: per partition, offsets are consumed in ascending order (Kafka's order). ``done`` may come
    in any order. A revoked partition is forgotten; late ``done`` calls for it are ignored, because the
    new owner re-reads from the last committed offset.

    Generations: a partition revoked with ``fence=True`` refuses records until it is assigned again,
    and a partition assigned with a ``generation`` refuses records that carry another one. A record
    fetched before a rebalance but handed over after it must never re-create the partition at its
    (later) position: the re-read of the offsets below it would then be skipped as re-fetches, and
    the committable offset (a floor every later flush records on its branch) would pass events that
    were only parked (issue 12, case 1).
    """

    def __init__(self) -> None:
        self._parts: dict[PartitionId, _Partition] = {}
        self._fenced: set[PartitionId] = set()

    def assign(self, tp: PartitionId, position: int | None = None, generation: int | None = None) -> None:
        """Start tracking ``tp`` afresh at ``position`` (its committed offset, committable at once;
        None: the first consumed offset) in consumer-group ``generation`` (None: not checked)."""
        self._fenced.discard(tp)
        self._parts[tp] = _Partition(position, generation)

    def revoke(self, tp: PartitionId, *, fence: bool = False) -> None:
        """Forget ``tp``: its in-flight events are re-read by the partition's next owner.

        ``fence``: refuse its records until ``assign`` (a rebalance took it away); without it the next
        consumed record starts tracking it again (a consumer that rewinds itself).
        """
        self._parts.pop(tp, None)
        if fence:
            self._fenced.add(tp)

    def fenced(self) -> list[PartitionId]:
        """Partitions revoked with ``fence=True`` and not assigned since."""
        return sorted(self._fenced)

    def is_tracked(self, tp: PartitionId) -> bool:
        """Whether ``tp`` is tracked now (assigned or consumed, and not revoked since)."""
        return tp in self._parts

    def is_assigned(self, tp: PartitionId, generation: int | None = None) -> bool:
        """Whether records of ``tp`` (fetched in ``generation``, if given) are taken."""
        if tp in self._fenced:
            return False
        part = self._parts.get(tp)
        return part is None or generation is None or part.generation is None or part.generation == generation

    def consumed(self, tp: PartitionId, offset: int, generation: int | None = None) -> bool:
        """Record that ``offset`` was read; False if it must be skipped: already seen here (a
        re-fetch), its partition is fenced (revoked, not assigned again), or it was fetched in
        another ``generation`` than the partition's assignment."""
        # ``is_assigned`` written out (one call and one partition lookup less an event): a tracked
        # partition is never fenced (``assign`` unfences, ``revoke`` forgets before it fences).
        part = self._parts.get(tp)
        if part is None:
            if tp in self._fenced:
                return False
            part = self._parts[tp] = _Partition(None, generation)
        elif generation is not None and part.generation is not None and part.generation != generation:
            return False
        position = part.position
        if position is not None and offset < position:
            return False
        part.queue.append(offset)
        part.inflight.add(offset)
        part.position = offset + 1
        return True

    def done(self, tp: PartitionId, offset: int) -> bool:
        """Mark ``offset`` committed or dead-lettered; False if ``tp`` is unknown or already done.

        Raises ValueError for an offset of a tracked partition that was never consumed: acking what was
        not read would let the committed offset skip an event.
        """
        part = self._parts.get(tp)
        if part is None:
            return False
        if offset not in part.inflight:
            if part.position is not None and offset < part.position:
                return False  # already done (or a gap below what was read): idempotent
            raise ValueError(f"offset {offset} of {tp} was never consumed")
        part.inflight.discard(offset)
        part.done.add(offset)
        _advance(part)
        return True

    def done_all(self, sources: Iterable[Source]) -> None:
        """``done`` for each source (a commit's events, thousands): the partition is looked up once
        per run of sources of one partition, and its queue's front advanced once per run."""
        parts = self._parts
        current: PartitionId | None = None
        part: _Partition | None = None
        for src in sources:
            topic, partition = src.topic, src.partition
            if current is None or partition != current[1] or topic != current[0]:
                if part is not None:
                    _advance(part)
                current = (topic, partition)
                part = parts.get(current)
            if part is None:
                continue  # revoked: its events are re-read by the next owner
            offset = src.offset
            if offset in part.inflight:
                part.inflight.discard(offset)
                part.done.add(offset)
            elif part.position is None or offset >= part.position:
                raise ValueError(f"offset {offset} of {current} was never consumed")
        if part is not None:
            _advance(part)

    def committable(self, tp: PartitionId) -> int | None:
        """The offset to commit for ``tp`` (first consumed offset not yet done), or None if unknown."""
        part = self._parts.get(tp)
        if part is None:
            return None
        if part.queue:
            return part.queue[0]
        return part.position

    def committable_all(self) -> dict[PartitionId, int]:
        """Committable offsets of every tracked partition that has one."""
        out: dict[PartitionId, int] = {}
        for tp in self._parts:
            offset = self.committable(tp)
            if offset is not None:
                out[tp] = offset
        return out

    def in_flight(self, tp: PartitionId | None = None) -> int:
        """How many consumed offsets are not done yet (of ``tp``, or of all partitions)."""
        if tp is not None:
            part = self._parts.get(tp)
            return len(part.inflight) if part else 0
        return sum(len(p.inflight) for p in self._parts.values())

    def partitions(self) -> list[PartitionId]:
        """The partitions being tracked."""
        return list(self._parts)


# --- exact offset sets as ranges ------------------------------------------------------------------


def to_ranges(offsets: Iterable[int]) -> list[OffsetRange]:
    """Sorted, merged half-open ranges covering exactly ``offsets`` (duplicates allowed, any order)."""
    out: list[OffsetRange] = []
    for offset in sorted(set(offsets)):
        if out and out[-1][1] == offset:
            out[-1] = (out[-1][0], offset + 1)
        else:
            out.append((offset, offset + 1))
    return out


def merge_ranges(*range_lists: Iterable[OffsetRange]) -> list[OffsetRange]:
    """The union of several range lists, sorted and merged (adjacent ranges join)."""
    spans = sorted((s, e) for ranges in range_lists for s, e in ranges if e > s)
    out: list[OffsetRange] = []
    for start, end in spans:
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def in_ranges(ranges: list[OffsetRange], offset: int) -> bool:
    """Whether ``offset`` lies in ``ranges`` (sorted and merged, as the helpers above return)."""
    i = bisect.bisect_right(ranges, offset, key=lambda r: r[0]) - 1
    return i >= 0 and ranges[i][0] <= offset < ranges[i][1]


def format_ranges(ranges: Iterable[OffsetRange]) -> str:
    """Ranges as text for commit properties: ``"5-9,12"`` means offsets 5..9 and 12 (inclusive)."""
    parts = []
    for start, end in ranges:
        parts.append(str(start) if end == start + 1 else f"{start}-{end - 1}")
    return ",".join(parts)


def parse_ranges(text: str) -> list[OffsetRange]:
    """Read ``format_ranges`` text back; raises ValueError on anything else."""
    out: list[OffsetRange] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, sep, last = part.partition("-")
        start = int(first)
        end = int(last) + 1 if sep else start + 1
        if start < 0 or end <= start:
            raise ValueError(f"bad offset range {part!r}")
        out.append((start, end))
    return merge_ranges(out)
