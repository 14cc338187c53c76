"""Stopping the intake while its group rebalances, with the real Kafka group.

aiokafka's ``consumer.stop()`` waits for the group's coordination task, and that task runs the
intake's rebalance listener, which takes the intake's lock. Closing the consumer while holding that
lock deadlocked the stop until its shutdown timeout (seen in CI as a 30 s timeout in
``test_intake_give_up.py``).
"""

from __future__ import annotations

import asyncio
import gc
import time
import warnings
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

from agents.deadletter_publisher import DeadLetterPublisher
from agents.kafka_loop import KafkaLoop
from streams.security import kafka_client_options
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.fakes import FakeCommitter
from tests.integration.intake_fixtures import intake, one_partition_group, until

pytestmark = pytest.mark.integration


async def test_a_stop_while_the_assign_listener_runs_does_not_wait_for_the_shutdown_timeout(
    settings: Settings, unique: str
) -> None:
    """Worker B joins; worker A's coordinator reaches its assign listener just as A is told to stop.
    Before, A closed its consumer while holding its lock, and the close waited for the coordination
    task, itself waiting for that lock in the listener: the stop hung until the shutdown timeout
    (120 s here). Now it takes seconds, and A acked the event it committed before leaving."""
    s = await one_partition_group(settings, "stopreb", unique, events=1)
    a_commits, b_commits = FakeCommitter(), FakeCommitter()
    a, b = intake(s, a_commits), intake(s, b_commits)
    assigning, go_on = asyncio.Event(), asyncio.Event()
    original = a.on_assigned

    async def held_assign(assigned: Any) -> None:
        assigning.set()
        await go_on.wait()
        await original(assigned)

    await a.start()
    runs = [asyncio.create_task(a.run())]
    try:
        await until(lambda: len(a_commits.batches) == 1, 60)
        await until(lambda: 1 in a._committed.values(), 30)  # noqa: SLF001
        a.on_assigned = held_assign  # type: ignore[method-assign]
        await b.start()
        runs.append(asyncio.create_task(b.run()))
        await asyncio.wait_for(assigning.wait(), 60)
        started = time.monotonic()
        stopping = asyncio.create_task(a.stop())
        await asyncio.sleep(0.5)  # the stop reaches the consumer's close
        go_on.set()
        await asyncio.wait_for(stopping, 60)
        assert time.monotonic() - started < 30, "the stop waited for its shutdown timeout"
        assert [e.event_id for bt in a_commits.batches for e in bt.events] == ["e0"]
        await until(lambda: set(b.assignment()) == {(s.objects_topic, 0), (s.links_topic, 0)}, 60)
        await asyncio.sleep(1.0)  # B has read from the committed offsets by now
        assert b_commits.batches == [], "A acked e0 before it left: B must not re-apply it"
    finally:
        go_on.set()
        await a.stop()
        await b.stop()
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)


class _LockingLoop(KafkaLoop):
    """The smallest loop whose assign listener takes the loop's lock, as schema sync's and the CDC
    ingest's revoke listeners do; its assign waits for ``go_on`` first."""

    name = "locking loop"

    def __init__(self, settings: Settings, topic: str, group: str) -> None:
        self.settings, self.topic, self.group = settings, topic, group
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._consumer = self._producer = None
        self.assigning, self.go_on = asyncio.Event(), asyncio.Event()

    async def start(self) -> None:
        loop = self

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: Any) -> None:
                pass

            async def on_partitions_assigned(self, assigned: Any) -> None:
                loop.assigning.set()
                await loop.go_on.wait()
                async with loop._lock:  # noqa: SLF001
                    pass

        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap, group_id=self.group, enable_auto_commit=False
        )
        self._consumer.subscribe([self.topic], listener=Listener())
        await self._consumer.start()

    async def step(self) -> int:
        consumer = self._consumer
        if consumer is None:
            return 0
        await consumer.getmany(timeout_ms=200)
        return 0


async def test_any_kafka_loop_stopped_while_its_listener_waits_for_its_lock_stops_at_once(
    settings: Settings, unique: str
) -> None:
    """The same deadlock in the loop schema sync and the CDC ingest share: their listeners take the
    loop's lock, and ``KafkaLoop.stop`` closed the consumer holding it."""
    s = settings.replace(
        objects_topic=f"objects-stoploop-{unique}",
        links_topic=f"links-stoploop-{unique}",
        dlq_topic=f"dlq-stoploop-{unique}",
        topic_partitions=1,
    )
    await ensure_topics(s)
    loop = _LockingLoop(s, s.objects_topic, f"stoploop-{unique}")
    await loop.start()  # the first assignment runs inside start: let it through
    run = asyncio.create_task(loop.run())
    try:
        await asyncio.wait_for(loop.assigning.wait(), 60)
        loop.go_on.set()
        await asyncio.sleep(0.5)
        loop.assigning.clear()
        loop.go_on.clear()
        other = AIOKafkaConsumer(
            s.objects_topic, bootstrap_servers=s.kafka_bootstrap, group_id=loop.group, enable_auto_commit=False
        )
        await other.start()  # a second member: the loop's coordinator rebalances into its assign listener
        try:
            poll = asyncio.create_task(other.getmany(timeout_ms=30_000))
            await asyncio.wait_for(loop.assigning.wait(), 60)
            stopping = asyncio.create_task(loop.stop())
            await asyncio.sleep(0.5)  # the stop reaches the consumer's close
            loop.go_on.set()
            await asyncio.wait_for(stopping, 30)
            poll.cancel()
        finally:
            await other.stop()
    finally:
        loop.go_on.set()
        await loop.stop()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


async def test_a_stopped_intake_closes_the_dead_letter_producer_it_started(settings: Settings, unique: str) -> None:
    """The intake starts its applier's dead-letter publisher (a Kafka producer) and used to leave it
    open at stop: every worker logged "Unclosed AIOKafkaProducer" when its event loop closed."""
    s = await one_partition_group(settings, "dlqstop", unique, events=0)
    a = intake(s, FakeCommitter(), DeadLetterPublisher(s.kafka_bootstrap, s.dlq_topic, kafka_client_options(s)))
    await a.start()
    await a.stop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del a
        gc.collect()
    assert [str(w.message) for w in caught if "Unclosed" in str(w.message)] == []
