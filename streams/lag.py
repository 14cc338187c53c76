"""Consumer-group lag, the one definition every caller uses (pure: no I/O).

Lag of a partition is what ``kafka-consumer-groups.sh --describe`` prints: the log end offset (the
next offset to be written) minus the group's committed offset (the next offset to read). A partition
the group never committed lags from its earliest retained offset (the tool prints ``-`` there; a
consumer with ``auto_offset_reset=earliest``, as causeway's are, starts there). Never negative.

The time lag is how long the oldest record the group has not committed has been waiting: the time
of the poll minus that record's timestamp, 0 when the group is caught up. It grows with a stall
whatever the rate, where a message count means different things at 10 and at 10,000 records/s.

The broker reads are in ``streams.lag_probe``; the exporter process in ``monitoring.lag_exporter``;
``cli`` offsets and the demo read lag through the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass


def partition_lag(end: int, low: int, committed: int | None) -> int:
    """Messages behind: ``end`` minus ``committed``, or minus ``low`` when never committed (None or < 0)."""
    start = low if committed is None or committed < 0 else committed
    return max(0, end - start)


def next_to_read(low: int, committed: int | None) -> int:
    """The offset the group reads next: its committed offset, or the earliest retained one."""
    return low if committed is None or committed < low else committed


def lag_seconds(now: float, oldest_waiting_timestamp: float | None) -> float:
    """Seconds the oldest uncommitted record has waited; 0 when none waits (or clocks disagree)."""
    if oldest_waiting_timestamp is None:
        return 0.0
    return max(0.0, now - oldest_waiting_timestamp)


@dataclass(frozen=True)
class PartitionOffsets:
    """One partition as the broker sees it for one consumer group."""

    topic: str
    partition: int
    end: int  # log end offset: the next offset to be written
    low: int  # earliest retained offset
    committed: int | None  # the group's committed offset (next to read); None if never committed
    oldest_waiting_timestamp: float | None = None  # Unix time of the record at next_to_read, if lag > 0

    @property
    def lag(self) -> int:
        return partition_lag(self.end, self.low, self.committed)

    @property
    def position(self) -> int:
        return next_to_read(self.low, self.committed)

    def lag_seconds(self, now: float) -> float:
        return lag_seconds(now, self.oldest_waiting_timestamp) if self.lag else 0.0
