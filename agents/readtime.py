"""How far the intake has read, in record time: the causal timeout's second clock (pure: no I/O).

A worker behind does not read its partitions at the same pace in time: aiokafka fetches every
partition in turn, so a small topic keeps up while a large one falls minutes behind (docs/
benchmarks.md, "what the worker's RSS follows while it is behind"). An effect read on the small
topic whose cause sits minutes back in the large one's backlog has not *missed* its cause: the
worker has not read that far. So the causal gate expires a wait only once the *read time* has
passed the effect's record time + the timeout (``CausalGate.expire``).

The read time of one partition is the timestamp of the last record read from it, or *now* once it
is read up to its high watermark (nothing more to read: a cause published before now would have
been read). The worker's read time is the minimum over its assigned partitions of both change
topics: every one of them has been read at least that far. A partition not fetched yet (its high
watermark unknown), or behind with no record read since its assignment, is not known: -inf, no
read-time expiry until it is.

Only the worker's own partitions count: a cause on a partition another worker owns is covered only
as far as that worker applies it (its marks; the branch's log lookup), see docs/architecture.md,
"A wait's timeout counts read time".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sinks.committed_offsets import PartitionId
from streams.lag import partition_lag

UNKNOWN = float("-inf")

# How far ahead of the least-read partition, in record time, a partition may read while parked
# events hold reading back: a few seconds, so partitions about level are not paused and resumed in
# turn every poll, and far below any causal timeout.
ALIGN_MARGIN_S = 5.0


@dataclass(slots=True)
class _Partition:
    position: int | None = None  # the next offset to read
    highwater: int | None = None  # the broker's next offset to write, as the last fetch reported
    timestamp: float | None = None  # Unix seconds of the last record read


def partition_read_time(now: float, position: int | None, highwater: int | None, timestamp: float | None) -> float:
    """One partition's read time: ``now`` when read up to its high watermark, else the last record
    read's timestamp; ``UNKNOWN`` when neither is known."""
    if position is not None and highwater is not None and partition_lag(highwater, position, position) == 0:
        return now
    return timestamp if timestamp is not None else UNKNOWN


class ReadTime:
    """Per assigned partition, where reading stands; fed by the intake after every poll."""

    def __init__(self) -> None:
        self._parts: dict[PartitionId, _Partition] = {}

    def assigned(self, tps: set[PartitionId]) -> None:
        """The partitions assigned now: others are forgotten, new ones start unknown."""
        for tp in [tp for tp in self._parts if tp not in tps]:
            del self._parts[tp]
        for tp in tps:
            self._parts.setdefault(tp, _Partition())

    def read(self, tp: PartitionId, last_offset: int, timestamp_ms: int | None) -> None:
        """The last record a poll returned on ``tp`` (a negative or missing timestamp is unknown)."""
        part = self._parts.get(tp)
        if part is None:
            return
        part.position = last_offset + 1
        if timestamp_ms is not None and timestamp_ms >= 0:
            part.timestamp = timestamp_ms / 1000

    def fetched(self, tp: PartitionId, position: int | None, highwater: int | None) -> None:
        """What the consumer knows after a poll: its position and the last fetch's high watermark."""
        part = self._parts.get(tp)
        if part is None:
            return
        if position is not None:
            part.position = position
        part.highwater = highwater

    def positioned(self, tp: PartitionId) -> bool:
        """True once ``tp``'s next offset to read is known (a record read, or a position given)."""
        part = self._parts.get(tp)
        return part is not None and part.position is not None

    def at(self, tp: PartitionId) -> float:
        """The record time read so far on ``tp`` (what an event just read there was read at)."""
        part = self._parts.get(tp)
        return part.timestamp if part is not None and part.timestamp is not None else UNKNOWN

    def times(self, now: float) -> dict[PartitionId, float]:
        """Each assigned partition's read time (``partition_read_time``)."""
        return {tp: partition_read_time(now, p.position, p.highwater, p.timestamp) for tp, p in self._parts.items()}

    def watermark(self, now: float) -> float:
        """The worker's read time: every assigned partition is read at least this far (``now``
        when there are none)."""
        return min(self.times(now).values(), default=now)


def to_pause(
    assigned: Collection[PartitionId],
    read_times: Mapping[PartitionId, float],
    *,
    held_back: bool,
    ceiling: bool,
    margin: float = ALIGN_MARGIN_S,
) -> set[PartitionId]:
    """The partitions to pause now (the intake resumes the others).

    ``ceiling``: memory's hard bound is reached (or commits lag): all of them. ``held_back``: the
    records parked events hold reached their soft bound: only the partitions read more than
    ``margin`` past the least-read one. Pausing all of them there stalls the worker: the causes the
    parked events wait for sit in the partitions behind (aiokafka reads partitions in turn, so a
    small topic runs minutes ahead of a large one), and nothing releases until the timeout
    dead-letters them. The least-read partition is never paused, so the read time keeps moving. A
    partition with no read time (not in ``read_times``, or unknown) counts as least read.
    """
    if ceiling:
        return set(assigned)
    if not held_back:
        return set()
    least = min((read_times.get(tp, UNKNOWN) for tp in assigned), default=UNKNOWN)
    return {tp for tp in assigned if read_times.get(tp, UNKNOWN) > least + margin}
