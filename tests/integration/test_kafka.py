"""streams/kafka.py against the real broker: the one metadata-refresh helper every tool uses."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.kafka import topic_partitions

pytestmark = pytest.mark.integration


async def test_a_topic_the_consumer_has_not_seen_is_found_after_one_refresh(kafka_bootstrap: str, unique: str) -> None:
    topic = f"test.kafka-helper.{unique}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    try:
        await admin.create_topics([NewTopic(topic, 3, 1)])
        await consumer.start()
        # Metadata is lazy: without the refresh, a started consumer does not know the new topic.
        assert not consumer.partitions_for_topic(topic)
        assert await topic_partitions(consumer, topic) == {0, 1, 2}
        assert await topic_partitions(consumer, f"{topic}.missing") == set()
    finally:
        await consumer.stop()
        await admin.delete_topics([topic])
        await admin.close()
