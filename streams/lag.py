"""Consumer-group lag as the broker sees it: end offsets minus the group's committed offsets."""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient


async def group_lag(bootstrap: str, group: str, topics: Iterable[str]) -> dict[tuple[str, int], int]:
    """Lag per (topic, partition) of ``topics`` for ``group``; a never-committed partition lags from 0."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await consumer.start()
    await admin.start()
    try:
        tps = [
            TopicPartition(topic, p)
            for topic in topics
            for p in sorted(consumer.partitions_for_topic(topic) or await _partitions(consumer, topic))
        ]
        if not tps:
            return {}
        ends = await consumer.end_offsets(tps)
        committed = await admin.list_consumer_group_offsets(group)
        out: dict[tuple[str, int], int] = {}
        for tp in tps:
            meta = committed.get(tp)
            start = meta.offset if meta is not None and meta.offset >= 0 else 0
            out[(tp.topic, tp.partition)] = max(0, ends[tp] - start)
        return out
    finally:
        await consumer.stop()
        await admin.close()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()  # metadata is fetched lazily for unknown topics
    return consumer.partitions_for_topic(topic) or set()
