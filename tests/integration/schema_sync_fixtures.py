"""Fixtures for the schema-sync tests: settings with unique topics, a world, a running agent, topic reads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.schema_sync import SchemaSync
from monitoring.metrics import Metrics
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings


@pytest.fixture
def sync_settings(settings: Settings, warehouse: str, unique: str, nessie_url: str, kafka_bootstrap: str) -> Settings:
    return settings.replace(
        warehouse=warehouse,
        app_id=f"cw-{unique}",
        schema_topic=f"schema.{unique}",
        schema_answer_topic=f"schema-answer.{unique}",
        schema_intelligence_topic=f"schema-intel.{unique}",
        dlq_topic=f"dlq.{unique}",
        commit_backoff_s=0.02,
    )


@pytest.fixture
def world(nessie_url: str, unique: str) -> str:
    with SyncNessieClient(nessie_url) as client:
        client.create_branch(f"world-t{unique}", Reference("main", "BRANCH", client.config().no_ancestor_hash))
    return f"t{unique}"


@pytest.fixture
async def agent(sync_settings: Settings) -> AsyncIterator[SchemaSync]:
    sync = SchemaSync(sync_settings, Metrics(), poll_timeout_ms=100)
    await sync.start()
    task = asyncio.create_task(sync.run())
    yield sync
    await sync.stop()
    task.cancel()


async def read_topic(settings: Settings, topic: str, n: int, timeout: float = 20) -> list[tuple[bytes, list]]:  # noqa: ASYNC109
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        out: list[tuple[bytes, list]] = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            for recs in (await consumer.getmany(tp, timeout_ms=500)).values():
                out += [(r.value, list(r.headers)) for r in recs]
        return out
    finally:
        await consumer.stop()


async def wait_for(predicate, timeout: float = 20, what: str = "condition") -> None:  # noqa: ASYNC109, ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(predicate):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
