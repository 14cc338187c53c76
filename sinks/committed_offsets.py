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
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import orjson

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
        if other.ranges:
            self.ranges = _union(self.ranges, other.ranges, self.floor)
            self._absorb()

    def raise_floor(self, floor: int) -> None:
        """Everything below ``floor`` is settled: drop detail under it."""
        if floor <= self.floor:
            return
        self.floor = floor
        kept: list[tuple[int, int]] = []
        for a, b in self.ranges:
            if b >= floor:
                kept.append((max(a, floor), b))
        self.ranges = kept
        self._absorb()

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


def dumps_map(offsets: Mapping[PartitionId, OffsetSet]) -> str:
    """The JSON summary stored as a table property (sorted, stable)."""
    return orjson.dumps(
        {tp_name(tp): s.to_json() for tp, s in sorted(offsets.items())}, option=orjson.OPT_SORT_KEYS
    ).decode()


def loads_map(text: str | None) -> OffsetMap:
    if not text:
        return {}
    doc = orjson.loads(text)
    return {parse_tp(name): OffsetSet.from_json(v) for name, v in doc.items()}


def merge_maps(
    base: Mapping[PartitionId, OffsetSet],
    added: Mapping[PartitionId, OffsetSet],
    settled: Mapping[PartitionId, int] | None = None,
) -> OffsetMap:
    """``base ∪ added``, with each partition's floor raised to ``settled`` where given."""
    out: OffsetMap = {tp: OffsetSet(s.floor, list(s.ranges)) for tp, s in base.items()}
    for tp, s in added.items():
        out.setdefault(tp, OffsetSet()).update(s)
    for tp, floor in (settled or {}).items():
        out.setdefault(tp, OffsetSet()).raise_floor(floor)
    return out


def copy_map(offsets: Mapping[PartitionId, OffsetSet]) -> OffsetMap:
    """An independent copy (its sets can be changed without touching ``offsets``)."""
    return {tp: OffsetSet(s.floor, list(s.ranges)) for tp, s in offsets.items()}


class MapMemo:
    """The committed-offset map last written per branch, so the next commit there parses nothing.

    Every commit reads the map from the branch's ``entity_events`` properties and writes the merged
    one back; the text a commit reads is, in steady state, the text the same worker wrote last on
    that branch. A read whose text equals the remembered text gets a copy of the remembered map
    (what ``loads_map`` of that text returns); any other text is parsed. Bounded: the least
    recently used branches are forgotten past ``max_branches``.
    """

    def __init__(self, max_branches: int = 1024) -> None:
        self.max_branches = max_branches
        self._last: OrderedDict[str, tuple[str, OffsetMap]] = OrderedDict()
        self._lock = threading.Lock()

    def loads(self, branch: str, text: str | None) -> OffsetMap:
        """``loads_map(text)``, served from what was last written on ``branch`` when the text is that."""
        with self._lock:
            hit = self._last.get(branch)
        if hit is not None and text and hit[0] == text:
            return copy_map(hit[1])
        return loads_map(text)

    def dumps(self, branch: str, offsets: Mapping[PartitionId, OffsetSet]) -> str:
        """``dumps_map(offsets)``, remembered as the text of ``branch``'s next read."""
        text = dumps_map(offsets)
        kept = copy_map(offsets)
        with self._lock:
            self._last[branch] = (text, kept)
            self._last.move_to_end(branch)
            while len(self._last) > self.max_branches:
                self._last.popitem(last=False)
        return text
