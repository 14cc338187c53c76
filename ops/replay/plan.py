"""Replay planning, filtering and checkpoints (pure: no Kafka, Redis or Nessie here).

A replay re-reads ``[start, end)`` of some topic-partitions and feeds the records through the normal
applier (see ``ops.replay.run``). This module decides *what* is read and keeps the checkpoint:

* ``ReplaySpec`` – the operator's request; its ``replay_id`` is a hash of it, so running the same
  command again finds the same checkpoint (resume, or "already complete").
* ``Checkpoint`` – per partition the fixed range and the next offset to read, plus counters. The
  end offsets are resolved once, when the replay starts, so a resumed replay reads the same range
  even though the topic has grown meanwhile.
* ``next_offset`` – where a partition may resume: the first offset that is read but neither
  committed, dead-lettered nor dropped as a duplicate. Everything below it took effect (or was
  filtered out), so a resume never skips an event; anything re-read above it is a duplicate that
  dedupe drops.
* ``rewrite`` – the into-world rewrite: an event of the source world becomes the same event of the
  target world (same event id, key ``<target>::<pk>``, every other field unchanged). ``caused_by``
  names event ids, which stay the same, so causal order carries over into the new world.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from models.errors import OperatorError
from models.events import ChangeEvent
from sinks.committed_offsets import PartitionId, parse_tp, tp_name

_RANGE = re.compile(r"(?:(?P<topic>[^/:]+)/)?(?P<partition>\d+):(?P<start>\d+)?-(?P<end>\d+)?")


class ReplayError(OperatorError, ValueError):
    """A replay request that cannot be carried out; the message says what to change."""


@dataclass(frozen=True)
class OffsetRange:
    """``[start, end)`` of one partition; ``None`` means earliest (start) or the current end (end)."""

    topic: str | None
    partition: int
    start: int | None
    end: int | None


def parse_range(text: str) -> OffsetRange:
    """``"[TOPIC/]P:START-END"`` (end exclusive; either side may be empty), e.g. ``"3:100-200"``."""
    m = _RANGE.fullmatch(text.strip())
    if m is None:
        raise ReplayError(f"bad offset range {text!r}: use [TOPIC/]PARTITION:START-END, e.g. 0:100-200")
    start = int(m["start"]) if m["start"] else None
    end = int(m["end"]) if m["end"] else None
    if start is not None and end is not None and end < start:
        raise ReplayError(f"bad offset range {text!r}: end {end} is before start {start}")
    return OffsetRange(m["topic"], int(m["partition"]), start, end)


@dataclass(frozen=True)
class ReplaySpec:
    topics: tuple[str, ...]
    ranges: tuple[OffsetRange, ...] = ()  # empty: every partition of every topic
    from_ms: int | None = None
    to_ms: int | None = None
    worlds: tuple[str, ...] = ()  # only these worlds (empty: all)
    types: tuple[str, ...] = ()  # only these object / link types (empty: all)
    into_world: str | None = None
    fork_from: str | None = None  # commit hash the into-world branch forks from

    def replay_id(self) -> str:
        doc = dataclasses.asdict(self)
        digest = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()
        return "r-" + digest[:12]

    def partitions(self, topic: str, available: Iterable[int]) -> list[int]:
        """Partitions of ``topic`` the spec asks for (all when no range names the topic)."""
        named = [r.partition for r in self.ranges if r.topic in (None, topic)]
        avail = sorted(available)
        if not self.ranges:
            return avail
        missing = sorted(set(named) - set(avail))
        if missing:
            raise ReplayError(f"topic {topic} has no partition {missing[0]} (it has {len(avail)})")
        return sorted(set(named))

    def explicit(self, tp: PartitionId) -> OffsetRange | None:
        for r in self.ranges:
            if r.partition == tp[1] and r.topic in (None, tp[0]):
                return r
        return None

    def selects(self, event: ChangeEvent) -> bool:
        """Whether the world / type filters keep ``event`` (into-world: only the source world)."""
        if self.worlds and event.world_id not in self.worlds:
            return False
        return not self.types or event.entity_type in self.types


def resolve_range(
    spec: ReplaySpec,
    tp: PartitionId,
    beginning: int,
    end: int,
    at_from: int | None,
    at_to: int | None,
) -> tuple[int, int]:
    """The concrete ``[start, end)`` of one partition.

    ``beginning``/``end`` are the partition's log start and end; ``at_from``/``at_to`` are the
    answers of ``offsets_for_times`` for the window (None when no record is that late: the end).
    Explicit offsets win over the window; everything is clamped to what the log still holds.
    """
    start, stop = beginning, end
    if spec.from_ms is not None:
        start = end if at_from is None else at_from
    if spec.to_ms is not None:
        stop = end if at_to is None else at_to
    explicit = spec.explicit(tp)
    if explicit is not None:
        if explicit.start is not None:
            start = explicit.start
        if explicit.end is not None:
            stop = explicit.end
    start = min(max(start, beginning), end)
    stop = min(max(stop, start), end)
    return start, stop


COUNTERS = (
    "read",
    "filtered_out",
    "invalid_skipped",
    "applied",
    "duplicates",
    "stale",
    "dead_lettered",
)


@dataclass
class Checkpoint:
    """Progress of one replay: per partition its range and the next offset to read."""

    replay_id: str
    spec: dict[str, Any]
    ranges: dict[str, tuple[int, int]]  # "topic/p" -> [start, end)
    next: dict[str, int]
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    runs: int = 0
    created_ms: int = 0
    updated_ms: int = 0
    fork_hash: str | None = None
    parked: int = 0  # events still waiting for a cause when the last run ended
    last_run_read: int = 0  # records read by the last run (also when it was interrupted)
    last_run_s: float = 0.0  # how long the last run took

    @classmethod
    def start(
        cls, replay_id: str, spec: ReplaySpec, ranges: Mapping[PartitionId, tuple[int, int]], now_ms: int
    ) -> Checkpoint:
        return cls(
            replay_id,
            dataclasses.asdict(spec),
            {tp_name(tp): (a, b) for tp, (a, b) in sorted(ranges.items())},
            {tp_name(tp): a for tp, (a, _) in sorted(ranges.items())},
            created_ms=now_ms,
            updated_ms=now_ms,
        )

    def tps(self) -> list[PartitionId]:
        return [parse_tp(name) for name in self.ranges]

    def remaining(self) -> dict[PartitionId, tuple[int, int]]:
        """``{tp: (next, end)}`` of partitions not finished."""
        out = {}
        for name, (_, end) in self.ranges.items():
            nxt = self.next.get(name, end)
            if nxt < end:
                out[parse_tp(name)] = (nxt, end)
        return out

    @property
    def total(self) -> int:
        return sum(end - start for start, end in self.ranges.values())

    @property
    def left(self) -> int:
        return sum(end - nxt for nxt, end in self.remaining().values())

    @property
    def complete(self) -> bool:
        return not self.remaining()

    def advance(self, tp: PartitionId, offset: int) -> None:
        """Record that ``tp`` may resume at ``offset`` (never moves backwards)."""
        name = tp_name(tp)
        self.next[name] = max(self.next.get(name, 0), min(offset, self.ranges[name][1]))

    def add(self, counts: Mapping[str, int]) -> None:
        for k, v in counts.items():
            self.counters[k] = self.counters.get(k, 0) + v

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Checkpoint:
        doc = orjson.loads(raw)
        doc["ranges"] = {k: (int(v[0]), int(v[1])) for k, v in doc["ranges"].items()}
        return cls(**doc)


def next_offset(read_position: int, first_in_flight: int | None) -> int:
    """Where a partition resumes: the first undone offset, or the read position when all are done."""
    return read_position if first_in_flight is None else min(first_in_flight, read_position)


def rewrite(event: ChangeEvent, into_world: str) -> ChangeEvent:
    """The same event in world ``into_world`` (same event id, version, cause and properties)."""
    return dataclasses.replace(event, world_id=into_world)
