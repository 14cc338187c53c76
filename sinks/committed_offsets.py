"""Exact committed-offset sets per Kafka topic-partition, in a compact text form.

A high-water mark per partition is not enough (BRIEF, "Traps"): while an event waits in the causal
gate, later offsets of its partition commit, and a mark past the parked offset would skip it after
a crash. So a branch records *exactly* which offsets it committed, as sorted disjoint inclusive
ranges — ``"100-180,182-200"`` — plus a ``floor``: every offset below the floor is settled (the
consumer group has committed past it, so it is never redelivered and needs no detail). The floor
keeps the set short: one partition carries events of many worlds, so a world's own offsets are
full of gaps that only the floor can absorb.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import orjson

from sinks.lru import Lru

PartitionId = tuple[str, int]
"""(topic, partition): a plain tuple, so pure code needs no Kafka client. aiokafka's own
``PartitionId`` (a named tuple of the same two fields) is used only where a client wants one."""


@dataclass(frozen=True, slots=True)
class Source:
    """Where an event was read: its Kafka topic, partition and offset."""

    topic: str
    partition: int
    offset: int

    @property
    def tp(self) -> PartitionId:
        return (self.topic, self.partition)


def tp_name(tp: PartitionId) -> str:
    """``"onto.changes.objects/3"``: the key used in commit properties and summaries."""
    return f"{tp[0]}/{tp[1]}"


def parse_tp(name: str) -> PartitionId:
    topic, _, partition = name.rpartition("/")
    if not topic or not partition.isdigit():
        raise ValueError(f"not a topic/partition: {name!r}")
    return topic, int(partition)


@dataclass
class OffsetSet:
    """A set of Kafka offsets: everything below ``floor`` plus inclusive ``ranges`` at or above it."""

    floor: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, offsets: Iterable[int]) -> OffsetSet:
        # ``compact`` is already sorted and disjoint: taken whole, not one insert per range (a
        # world's offsets are mostly single ones; the inserts cost ~2 % of a worker's samples).
        result = cls()
        result.ranges = _union([], compact(offsets), result.floor)
        result._absorb()
        return result

    @classmethod
    def parse(cls, text: str, floor: int = 0) -> OffsetSet:
        """Parse ``"100-180,182-200"`` (single offsets may omit the ``-end``)."""
        result = cls(floor=floor)
        parsed: list[tuple[int, int]] = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            start, _, end = part.partition("-")
            a, b = int(start), int(end or start)
            if b < a:
                raise ValueError(f"bad offset range {part!r}")
            parsed.append((a, b))
        # What ``format`` wrote is sorted, disjoint and above the floor: take it as it is (one
        # insert per range cost ~3% of a worker's samples, parsing the branch's map every commit).
        last = floor - 1
        for a, b in parsed:
            if a <= last + 1:
                break
            last = b
        else:
            result.ranges = parsed
            return result
        for a, b in parsed:
            result.add_range(a, b)
        return result

    def format(self) -> str:
        return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.ranges)

    def add(self, offset: int) -> None:
        self.add_range(offset, offset)

    def add_range(self, start: int, end: int) -> None:
        """Insert ``start..end`` (inclusive), merging with touching or overlapping ranges."""
        if end < self.floor:
            return
        start = max(start, self.floor)
        i = bisect.bisect_left(self.ranges, (start, start))
        if i > 0 and self.ranges[i - 1][1] >= start - 1:
            i -= 1
        j = i
        while j < len(self.ranges) and self.ranges[j][0] <= end + 1:
            start = min(start, self.ranges[j][0])
            end = max(end, self.ranges[j][1])
            j += 1
        self.ranges[i:j] = [(start, end)]
        self._absorb()

    def update(self, other: OffsetSet) -> None:
        # One merge of two sorted lists: an insert per range (bisect, then a slice assignment that
        # moves the tail) made every commit's merge of a batch's offsets cost ~3 % of the samples.
        self.raise_floor(other.floor)
        added = other.ranges
        if not added:
            return
        ranges = self.ranges
        last = ranges[-1][1] if ranges else self.floor - 1
        if added[0][0] > last and _canonical(added):
            # The common merge: a batch's offsets all past what the branch holds. Appended without
            # a pass over the held ranges (a world's set above the floor is mostly single offsets,
            # hundreds of them, and the Python pass over them was most of the map's merge).
            if ranges and added[0][0] == last + 1:
                ranges[-1] = (ranges[-1][0], added[0][1])
                ranges.extend(added[1:])
            else:
                ranges.extend(added)
        else:
            # Released parked events bring offsets below the last held one: only the held ranges
            # from the first that may touch them on are merged, the ones before kept by a slice.
            i = bisect.bisect_left(ranges, added[0][0] - 1, key=_end)
            self.ranges = ranges[:i] + _union(ranges[i:], added, self.floor) if i else _union(ranges, added, self.floor)
        self._absorb()

    def raise_floor(self, floor: int) -> None:
        """Everything below ``floor`` is settled: drop detail under it."""
        if floor <= self.floor:
            return
        self.floor = floor
        ranges = self.ranges
        # Ends are sorted like starts (disjoint ranges): the first range that survives is found by
        # bisection and the rest kept by one slice, not a Python pass over every range.
        i = bisect.bisect_left(ranges, floor, key=_end)
        kept = ranges[i:]
        if kept and kept[0][0] < floor:
            kept[0] = (floor, kept[0][1])
        self.ranges = kept
        self._absorb()

    def copy(self) -> OffsetSet:
        """An independent copy (the ranges are immutable tuples: the list is what is copied)."""
        return OffsetSet(self.floor, list(self.ranges))

    def _absorb(self) -> None:
        ranges, n = self.ranges, 0
        while n < len(ranges) and ranges[n][0] <= self.floor:
            self.floor = max(self.floor, ranges[n][1] + 1)
            n += 1
        if n:
            del ranges[:n]

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        if offset < self.floor:
            return True
        i = bisect.bisect_right(self.ranges, (offset, float("inf"))) - 1
        return i >= 0 and self.ranges[i][0] <= offset <= self.ranges[i][1]

    def offsets(self) -> Iterator[int]:
        """The explicit offsets at or above the floor."""
        for a, b in self.ranges:
            yield from range(a, b + 1)

    def to_json(self) -> dict[str, object]:
        return {"floor": self.floor, "ranges": self.format()}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> OffsetSet:
        return cls.parse(str(doc.get("ranges") or ""), floor=int(doc.get("floor") or 0))  # type: ignore[call-overload]

    def __str__(self) -> str:
        text = self.format()
        return f"<{self.floor}" + (f",{text}" if text else "") if self.floor else text


def _end(r: tuple[int, int]) -> int:
    return r[1]


def _canonical(ranges: list[tuple[int, int]]) -> bool:
    """Sorted, disjoint and not touching: what every ``OffsetSet`` holds (``of``, ``parse``,
    ``add_range`` keep it so); checked where a merge would take ``ranges`` as they are."""
    last = None
    for a, b in ranges:
        if b < a or (last is not None and a <= last + 1):
            return False
        last = b
    return True


def _union(a: list[tuple[int, int]], b: list[tuple[int, int]], floor: int) -> list[tuple[int, int]]:
    """The sorted disjoint ranges covering ``a ∪ b`` at or above ``floor`` (both sorted by start;
    either may overlap or touch the other), merged in one pass."""
    out: list[tuple[int, int]] = []
    # Most merges add offsets past everything held: no interleaving needed then.
    pairs = itertools.chain(a, b) if not a or not b or b[0][0] > a[-1][1] else heapq.merge(a, b)
    for start, end in pairs:
        if end < floor:
            continue
        start = max(start, floor)
        if out and start <= out[-1][1] + 1:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def compact(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted disjoint inclusive ranges covering exactly ``offsets`` (duplicates allowed)."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(offsets)):
        if out and o == out[-1][1] + 1:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


def format_ranges(offsets: Iterable[int]) -> str:
    """``[100, 101, 102, 105]`` → ``"100-102,105"``."""
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in compact(offsets))


OffsetMap = dict[PartitionId, OffsetSet]

_Stored = Mapping[str, object]
"""One partition's entry as stored: ``{"floor": ..., "ranges": "..."}``."""


def _parse_stored(doc: _Stored) -> OffsetSet:
    return OffsetSet.from_json(doc)


class StoredMap(Mapping[PartitionId, OffsetSet]):
    """A committed-offset map read from its stored text: each partition's entry is kept as read and
    parsed into an :class:`OffsetSet` only when asked for; the partitions a merge changed are sets.

    With two workers every world's map holds both workers' partitions, and a commit reads the map
    the other worker wrote last: parsing and re-formatting all of it was 8 % of a 2-worker run's
    samples. A commit asks only for its batch's partitions (the worker's own) and carries the
    others to the map it writes as the entries it read, so its cost on the map follows its own
    partitions, not the number of writers. Read-only: :func:`merge_maps` makes a new one.
    """

    __slots__ = ("_parse", "_sets", "_stored")

    def __init__(
        self,
        stored: dict[PartitionId, _Stored],
        sets: dict[PartitionId, OffsetSet] | None = None,
        parse: Callable[[PartitionId, _Stored], OffsetSet] | None = None,
    ) -> None:
        #: Entries whose stored form is current (a partition also in ``_sets`` was parsed from it).
        self._stored = stored
        #: Parsed sets, and the sets of partitions changed since the text was read (not in ``_stored``).
        self._sets = sets if sets is not None else {}
        self._parse = parse or (lambda _tp, doc: _parse_stored(doc))

    def __getitem__(self, tp: PartitionId) -> OffsetSet:
        found = self._sets.get(tp)
        if found is None:
            found = self._sets[tp] = self._parse(tp, self._stored[tp])
        return found

    def __contains__(self, tp: object) -> bool:
        return tp in self._stored or tp in self._sets

    def __iter__(self) -> Iterator[PartitionId]:
        yield from self._stored
        yield from (tp for tp in self._sets if tp not in self._stored)

    def __len__(self) -> int:
        return len(self._stored) + sum(1 for tp in self._sets if tp not in self._stored)

    def entries(self) -> dict[PartitionId, _Stored]:
        """Every partition's stored form: as read where unchanged, formatted where changed."""
        out: dict[PartitionId, _Stored] = dict(self._stored)
        for tp, s in self._sets.items():
            if tp not in self._stored:
                out[tp] = s.to_json()
        return out

    def changed(self) -> dict[PartitionId, OffsetSet]:
        """The sets of the partitions changed since the text was read (what a writer formats)."""
        return {tp: s for tp, s in self._sets.items() if tp not in self._stored}


def dumps_map(offsets: Mapping[PartitionId, OffsetSet]) -> str:
    """The JSON summary stored as a table property (sorted, stable)."""
    entries = offsets.entries() if isinstance(offsets, StoredMap) else {tp: s.to_json() for tp, s in offsets.items()}
    return _dumps_entries(entries)


def _dumps_entries(entries: Mapping[PartitionId, _Stored]) -> str:
    return orjson.dumps({tp_name(tp): e for tp, e in entries.items()}, option=orjson.OPT_SORT_KEYS).decode()


def loads_map(text: str | None) -> OffsetMap:
    if not text:
        return {}
    doc = orjson.loads(text)
    return {parse_tp(name): OffsetSet.from_json(v) for name, v in doc.items()}


def _stored_entries(text: str | None) -> dict[PartitionId, _Stored]:
    return {parse_tp(name): v for name, v in orjson.loads(text).items()} if text else {}


def merge_maps(
    base: Mapping[PartitionId, OffsetSet],
    added: Mapping[PartitionId, OffsetSet],
    settled: Mapping[PartitionId, int] | None = None,
) -> StoredMap:
    """``base ∪ added``, with each partition's floor raised to ``settled`` where given.

    Only the partitions of ``added`` and ``settled`` are read and copied; the others are carried as
    ``base`` holds them (a :class:`StoredMap`'s entries as read). A merged partition that equals
    what ``base`` held keeps its stored form. ``base`` is never changed.
    """
    settled = settled or {}
    touched = added.keys() | settled.keys()
    stored: dict[PartitionId, _Stored]
    if isinstance(base, StoredMap):
        stored = {tp: e for tp, e in base._stored.items() if tp not in touched}
        sets = {tp: s.copy() for tp, s in base._sets.items() if tp not in touched and tp not in base._stored}
    else:
        stored, sets = {}, {tp: s.copy() for tp, s in base.items() if tp not in touched}
    for tp in touched:
        held = base[tp] if tp in base else None
        s = held.copy() if held is not None else OffsetSet()
        if tp in added:
            s.update(added[tp])
        if tp in settled:
            s.raise_floor(settled[tp])
        if held is not None and isinstance(base, StoredMap) and tp in base._stored and s == held:
            stored[tp] = base._stored[tp]
        sets[tp] = s
    return StoredMap(stored, sets)


def copy_map(offsets: Mapping[PartitionId, OffsetSet]) -> OffsetMap:
    """An independent copy (its sets can be changed without touching ``offsets``)."""
    return {tp: s.copy() for tp, s in offsets.items()}


class MapMemo:
    """What this worker last wrote per branch and partition, so the next commit parses nothing.

    Every commit reads the map from the branch's ``entity_events`` properties and writes the merged
    one back. With one worker the text it reads is the text it wrote last on that branch: served
    whole, no JSON parsed. With several, the text is another worker's, but that worker changed only
    its own partitions' entries: this worker's entries are still what it wrote, so a partition whose
    stored entry equals the one remembered gets a copy of the remembered set, and any other entry is
    parsed. Bounded: the least recently used branches (and partitions) are forgotten past the bound.
    """

    def __init__(self, max_branches: int = 1024, max_partitions: int = 16384) -> None:
        self.max_branches = max_branches
        self.max_partitions = max_partitions
        self._last: Lru[str, tuple[str, dict[PartitionId, _Stored]]] = Lru(max_branches)
        self._sets: Lru[tuple[str, PartitionId], tuple[_Stored, OffsetSet]] = Lru(max_partitions)
        self._lock = threading.Lock()

    def loads(self, branch: str, text: str | None) -> StoredMap:
        """The map ``text`` holds (equal to ``loads_map(text)``), each partition parsed only when
        asked for and served from what was last written on ``branch`` where its entry is that."""
        with self._lock:
            hit = self._last.get(branch)
        stored = dict(hit[1]) if hit is not None and text and hit[0] == text else _stored_entries(text)
        return StoredMap(stored, parse=lambda tp, doc: self._parse(branch, tp, doc))

    def _parse(self, branch: str, tp: PartitionId, doc: _Stored) -> OffsetSet:
        with self._lock:
            hit = self._sets.recent((branch, tp))
        if hit is not None and hit[0] == doc:
            return hit[1].copy()
        return _parse_stored(doc)

    def dumps(self, branch: str, offsets: Mapping[PartitionId, OffsetSet]) -> str:
        """``dumps_map(offsets)``, remembered as the text of ``branch``'s next read."""
        if not isinstance(offsets, StoredMap):
            offsets = StoredMap({}, copy_map(offsets))
        entries = offsets.entries()
        text = _dumps_entries(entries)
        kept = {tp: (entries[tp], s.copy()) for tp, s in offsets.changed().items()}
        with self._lock:
            self._last.keep(branch, (text, entries))
            for tp, entry in kept.items():
                self._sets.keep((branch, tp), entry)
        return text
