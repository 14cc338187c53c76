"""Consumer lag as the broker sees it, for the worker's ``/metrics``.

``OffsetProbe`` asks the broker, with its own long-lived clients (never Faust's consumer, whose
aiokafka client lives on Faust's consumer thread and loop), for

* each partition's log end offset (high watermark, ``ListOffsets`` latest, read-uncommitted) and its
  earliest retained offset, and
* the consumer group's committed offsets (``OffsetFetch``, one request for all partitions),

which are exactly the numbers ``kafka-consumer-groups.sh --describe`` prints as LOG-END-OFFSET and
CURRENT-OFFSET; LAG is their difference. A partition the group never committed lags from its earliest
retained offset (the tool prints ``-`` there).

One poll costs two or three small requests whatever the partition count. The clients start on first
use and are rebuilt after a failure, so a broker outage shows as ``causeway_dependency_up{dependency=
"kafka"} 0`` and recovers on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from monitoring.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionOffsets:
    topic: str
    partition: int
    end: int  # log end offset: the next offset to be written
    low: int  # earliest retained offset
    committed: int | None  # the group's committed offset (next to read); None if never committed

    @property
    def lag(self) -> int:
        start = self.low if self.committed is None or self.committed < 0 else self.committed
        return max(0, self.end - start)


class OffsetProbe:
    """End, earliest and group-committed offsets of some partitions, from the broker."""

    def __init__(self, bootstrap: str, group: str, request_timeout_ms: int = 10_000) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.request_timeout_ms = request_timeout_ms
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None

    async def _clients(self) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
        if self._consumer is None or self._admin is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                enable_auto_commit=False,
                request_timeout_ms=self.request_timeout_ms,
            )
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=self.request_timeout_ms)
            try:
                await consumer.start()
                await admin.start()
            except BaseException:
                await _quietly_stop(consumer, admin)
                raise
            self._consumer, self._admin = consumer, admin
        return self._consumer, self._admin

    async def offsets(self, partitions: Iterable[tuple[str, int]]) -> list[PartitionOffsets]:
        """Offsets of ``partitions`` (topic, partition); raises if the broker cannot answer."""
        tps = sorted({TopicPartition(t, p) for t, p in partitions})
        if not tps:
            return []
        try:
            consumer, admin = await self._clients()
            # Committed first, then end offsets: a commit landing in between can only make the lag
            # we report smaller than the truth, never larger than the log allows.
            committed = await admin.list_consumer_group_offsets(self.group, partitions=tps)
            ends = await consumer.end_offsets(tps)
            lows = await consumer.beginning_offsets(tps)
        except BaseException:
            await self.close()  # rebuild the clients on the next poll
            raise
        out = []
        for tp in tps:
            meta = committed.get(tp)
            offset = meta.offset if meta is not None and meta.offset >= 0 else None
            out.append(PartitionOffsets(tp.topic, tp.partition, int(ends[tp]), int(lows[tp]), offset))
        return out

    async def export(self, metrics: Metrics, partitions: Iterable[tuple[str, int]]) -> list[PartitionOffsets]:
        """Poll ``partitions`` and set their offset and lag gauges; marks Kafka up or down."""
        try:
            result = await self.offsets(partitions)
        except Exception:
            metrics.dependency("kafka", False)
            raise
        metrics.dependency("kafka", True)
        for po in result:
            metrics.partition_offsets(po.topic, po.partition, po.end, po.committed, low_offset=po.low)
        return result

    async def close(self) -> None:
        consumer, admin, self._consumer, self._admin = self._consumer, self._admin, None, None
        await _quietly_stop(consumer, admin)


async def _quietly_stop(consumer: AIOKafkaConsumer | None, admin: AIOKafkaAdminClient | None) -> None:
    for stop in (consumer.stop if consumer else None, admin.close if admin else None):
        if stop is None:
            continue
        try:
            await stop()
        except Exception as exc:  # noqa: BLE001 - closing a broken client must not mask the first error
            log.debug("closing a Kafka client failed: %s", exc)
