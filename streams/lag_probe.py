"""Consumer-group offsets from the broker: the I/O half of ``streams.lag``.

``OffsetProbe`` asks the broker, with its own long-lived clients (never a worker's consumer), for

* the partitions of some topics (``Metadata`` through the admin client),
* the group's committed offsets (``OffsetFetch``, one request for all partitions),
* each partition's log end offset (high watermark, read-uncommitted) and earliest retained offset,
* for a partition that lags, the timestamp of the next record the group will read (one small fetch),

which are the numbers ``kafka-consumer-groups.sh --describe`` prints as LOG-END-OFFSET and
CURRENT-OFFSET, plus the age of the oldest record waiting. The clients start on first use, are kept
between polls and rebuilt after a failure (``streams.kept_client``), so a broker outage is an exception
from one poll and recovers on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.kept_client import KeptClient
from streams.lag import PartitionOffsets

log = logging.getLogger(__name__)

# Faust keeps its partition-assignor leader in an internal topic the group also commits: not input.
INTERNAL_TOPIC_MARKERS = ("__assignor-__leader", "__consumer_offsets")
FETCH_TIMEOUT_S = 2.0


class OffsetProbe:
    """End, earliest and group-committed offsets (and oldest waiting record times) from the broker."""

    def __init__(
        self, bootstrap: str, request_timeout_ms: int = 10_000, kafka_options: dict[str, Any] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self._options = kafka_options or {}  # streams.security.kafka_client_options
        self.request_timeout_ms = request_timeout_ms
        self._kept: KeptClient[tuple[AIOKafkaConsumer, AIOKafkaAdminClient]] = KeptClient(
            self._open, lambda clients: _quietly_stop(*clients)
        )

    @property
    def opened(self) -> int:
        """Client pairs opened so far: one for the probe's life while the broker answers."""
        return self._kept.opened

    async def _open(self) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            request_timeout_ms=self.request_timeout_ms,
            max_partition_fetch_bytes=16 * 1024,  # one record's timestamp is all a fetch needs
            **self._options,
        )
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, request_timeout_ms=self.request_timeout_ms, **self._options
        )
        try:
            await consumer.start()
            await admin.start()
        except BaseException:
            await _quietly_stop(consumer, admin)
            raise
        return consumer, admin

    async def partitions(self, topics: Iterable[str]) -> list[tuple[str, int]]:
        """(topic, partition) of each existing topic in ``topics``; unknown topics are left out."""
        names = sorted(set(topics))
        if not names:
            return []
        out = []
        for desc in await self._kept.call(lambda clients: clients[1].describe_topics(names)):
            if desc.get("error_code", 0) != 0:
                continue
            out += [(desc["topic"], p["partition"]) for p in desc.get("partitions", ())]
        return sorted(out)

    async def committed_topics(self, group: str) -> set[str]:
        """Topics ``group`` has committed offsets for (Faust's internal topics left out)."""
        committed = await self._kept.call(lambda clients: clients[1].list_consumer_group_offsets(group))
        return {tp.topic for tp in committed if not any(m in tp.topic for m in INTERNAL_TOPIC_MARKERS)}

    async def offsets(
        self, group: str, partitions: Iterable[tuple[str, int]], *, with_times: bool = False
    ) -> list[PartitionOffsets]:
        """Offsets of ``partitions`` for ``group``; ``with_times`` also reads the oldest waiting record's
        timestamp of each lagging partition. Raises if the broker cannot answer."""
        tps = sorted({TopicPartition(t, p) for t, p in partitions})
        if not tps:
            return []

        async def read(clients: tuple[AIOKafkaConsumer, AIOKafkaAdminClient]) -> list[PartitionOffsets]:
            consumer, admin = clients
            # Committed first, then end offsets: a commit landing in between can only make the lag
            # we report smaller than the truth, never larger than the log allows.
            committed = await admin.list_consumer_group_offsets(group, partitions=tps)
            ends = await consumer.end_offsets(tps)
            lows = await consumer.beginning_offsets(tps)
            out = []
            for tp in tps:
                meta = committed.get(tp)
                offset = meta.offset if meta is not None and meta.offset >= 0 else None
                out.append(PartitionOffsets(tp.topic, tp.partition, int(ends[tp]), int(lows[tp]), offset))
            return await self._with_times(consumer, out) if with_times else out

        return await self._kept.call(read)

    async def group_lag(self, group: str, topics: Iterable[str]) -> dict[tuple[str, int], int]:
        """Lag per (topic, partition) of ``topics`` for ``group``."""
        rows = await self.offsets(group, await self.partitions(topics))
        return {(r.topic, r.partition): r.lag for r in rows}

    async def _with_times(self, consumer: AIOKafkaConsumer, rows: Sequence[PartitionOffsets]) -> list[PartitionOffsets]:
        """Read the record at each lagging partition's position and keep its timestamp."""
        lagging = {TopicPartition(r.topic, r.partition): r for r in rows if r.lag > 0}
        if not lagging:
            return list(rows)
        consumer.assign(list(lagging))
        for tp, row in lagging.items():
            consumer.seek(tp, row.position)
        found: dict[TopicPartition, float] = {}
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        while len(found) < len(lagging) and time.monotonic() < deadline:
            waiting = [tp for tp in lagging if tp not in found]
            batches = await consumer.getmany(*waiting, timeout_ms=200, max_records=len(waiting))
            for tp, records in batches.items():
                if records and tp not in found:
                    found[tp] = records[0].timestamp / 1000.0
                    consumer.pause(tp)
        consumer.assign([])
        if len(found) < len(lagging):
            log.debug(
                "no record timestamp within %.1f s for %d partition(s)", FETCH_TIMEOUT_S, len(lagging) - len(found)
            )
        out = []
        for row in rows:
            ts = found.get(TopicPartition(row.topic, row.partition))
            out.append(row if ts is None else _replace_ts(row, ts))
        return out

    async def close(self) -> None:
        await self._kept.aclose()


def _replace_ts(row: PartitionOffsets, ts: float) -> PartitionOffsets:
    return PartitionOffsets(row.topic, row.partition, row.end, row.low, row.committed, ts)


async def _quietly_stop(consumer: AIOKafkaConsumer | None, admin: AIOKafkaAdminClient | None) -> None:
    for stop in (consumer.stop if consumer else None, admin.close if admin else None):
        if stop is None:
            continue
        try:
            await stop()
        except Exception as exc:  # noqa: BLE001 - closing a broken client must not mask the first error
            log.debug("closing a Kafka client failed: %s", exc)
