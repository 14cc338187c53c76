"""Shared by the intake's integration tests: an intake over fakes (real Kafka, stand-in services) and a wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiokafka import AIOKafkaProducer

from agents.applier import Applier
from agents.deadletter_publisher import DeadLetterPublisher
from agents.intake import ChangeIntake
from monitoring.metrics import Metrics
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.fakes import FakeCommitter, FakeDlq, FakeMarks, FakeWorlds, NessieDown, event


def intake(
    settings: Settings, committer: FakeCommitter | NessieDown, dead_letters: DeadLetterPublisher | None = None
) -> ChangeIntake:
    """A real ``ChangeIntake`` (real Kafka group) whose applier commits through ``committer`` (and
    dead-letters through ``dead_letters``, default a list in memory)."""
    applier = Applier(
        settings,
        marks=FakeMarks(),
        committer=committer,
        dead_letters=dead_letters or FakeDlq(),
        worlds=FakeWorlds(),
        metrics=Metrics(),
        pipelined=True,
    )
    return ChangeIntake(settings, applier)


async def until(check: Callable[[], bool], seconds: float, every: float = 0.1) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(every)


async def one_partition_group(settings: Settings, name: str, unique: str, events: int) -> Settings:
    """Settings for a group of its own over one-partition topics, with ``events`` events (``e0``…)
    published to the objects topic's partition 0 before any worker starts."""
    s = settings.replace(
        app_id=f"{name}-{unique}",
        objects_topic=f"objects-{name}-{unique}",
        links_topic=f"links-{name}-{unique}",
        dlq_topic=f"dlq-{name}-{unique}",
        topic_partitions=1,
        batch_max_events=100,
        batch_max_seconds=0.0,
        shutdown_timeout_s=120.0,
    )
    await ensure_topics(s)
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        for n in range(events):
            await producer.send_and_wait(s.objects_topic, event(n), key=f"prod::p{n}".encode(), partition=0)
    finally:
        await producer.stop()
    return s
