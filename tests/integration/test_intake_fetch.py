"""The intake's fetches of a trickle, against the real Kafka: records gather at the broker for up to
``intake_fetch_wait_ms`` instead of coming a few a poll (each poll costs the worker CPU)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from streams.settings import Settings
from tests.fakes import FakeCommitter, event
from tests.integration.intake_fixtures import intake, one_partition_group, until

pytestmark = pytest.mark.integration

TRICKLE = 40


async def _polls_with_records(s: Settings) -> int:
    """Start an intake, send ``TRICKLE`` events 25 ms apart, and count the polls that brought any."""
    committer = FakeCommitter()
    worker = intake(s, committer)
    brought: list[int] = []
    admit = worker.admit

    def counting(polled, generation, assigned):  # type: ignore[no-untyped-def]
        out = admit(polled, generation, assigned)
        if out:
            brought.append(len(out))
        return out

    worker.admit = counting  # type: ignore[method-assign]
    await worker.start()
    run = asyncio.create_task(worker.run())
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        await until(lambda: bool(worker.assignment()), 60)
        for n in range(TRICKLE):
            await producer.send_and_wait(s.objects_topic, event(n), key=f"prod::p{n}".encode(), partition=0)
            await asyncio.sleep(0.025)
        await until(lambda: sum(len(b.events) for b in committer.batches) == TRICKLE, 60)
    finally:
        await producer.stop()
        await worker.stop()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    assert sum(brought) == TRICKLE
    return len(brought)


async def test_a_trickle_is_read_in_few_polls_and_each_fetch_waits_at_most_the_wait(
    settings: Settings, unique: str
) -> None:
    """Before, a fetch returned as soon as one record arrived: a trickle of 40 records over a second
    came in about as many polls. With a 400 ms wait and the default minimum bytes, a handful."""
    gathered = await one_partition_group(settings.replace(intake_fetch_wait_ms=400), "trickle", unique, events=0)
    eager = await one_partition_group(
        settings.replace(intake_fetch_wait_ms=400, intake_fetch_min_bytes=1), "eager", unique, events=0
    )
    assert await _polls_with_records(gathered) <= 8
    assert await _polls_with_records(eager) >= 15  # the same trickle, fetched as it comes
