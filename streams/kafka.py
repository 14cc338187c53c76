"""Small helpers over aiokafka clients that more than one tool needs (one copy each)."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    """The partition ids of ``topic``; empty when the broker does not know the topic.

    aiokafka fetches metadata lazily, for the topics a client subscribed to or already asked about,
    so a started consumer answers "unknown" for any other topic until its metadata is refreshed: a
    topic it has not seen yet is looked up once more after a forced refresh.
    """
    parts = consumer.partitions_for_topic(topic)
    if not parts:
        await consumer._client.force_metadata_update()  # noqa: SLF001 - aiokafka has no public refresh
        parts = consumer.partitions_for_topic(topic)
    return set(parts or ())
