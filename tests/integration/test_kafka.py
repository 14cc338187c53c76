"""Kafka helpers against the real broker: the one metadata-refresh helper every tool uses, and topic
creation that keeps a first run free of aiokafka ERROR lines."""

from __future__ import annotations

import logging

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.kafka import topic_partitions
from streams.settings import Settings
from streams.topics import ensure_topic

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


async def test_a_topic_created_up_front_is_produced_to_without_an_error_line(
    settings: Settings, kafka_bootstrap: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``causeway doctor`` creates its topic first: auto-creation on produce logs an aiokafka ERROR."""
    topic = f"test.doctor.{unique}"
    assert await ensure_topic(settings, topic) is True
    assert await ensure_topic(settings, topic) is False  # already there
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        with caplog.at_level(logging.WARNING):
            await producer.send_and_wait(topic, b"x")
    finally:
        await producer.stop()
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        await admin.delete_topics([topic])
        await admin.close()
    # The asyncio logger is left out: a task another test left pending can be garbage-collected
    # during the send and logs "Task was destroyed but it is pending" (seen once in a full run).
    assert [r for r in caplog.records if r.levelno >= logging.WARNING and r.name != "asyncio"] == []
