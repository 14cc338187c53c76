"""The lifecycle shared by causeway's own aiokafka loops (CDC ingest, schema sync).

Subclasses create ``_consumer`` / ``_producer`` in ``start`` and implement ``step`` (one poll, its
handling and its offset commit, under ``_lock``; a step that finds ``_consumer`` gone under the
lock returns at once). This class stops them after the step in flight and runs ``step`` until
stopped, retrying the errors a subclass names after a pause.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar, Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import ConsumerStoppedError

log = logging.getLogger(__name__)


class KafkaLoop:
    #: Errors after which ``run`` pauses ``retry_pause_s`` and polls again; anything else ends it.
    retry_on: ClassVar[tuple[type[BaseException], ...]] = ()
    name: ClassVar[str] = "kafka loop"

    _lock: asyncio.Lock
    _stopping: asyncio.Event
    _consumer: AIOKafkaConsumer | None
    _producer: AIOKafkaProducer | None

    @property
    def retry_pause_s(self) -> float:
        return 1.0

    async def start(self) -> None:
        raise NotImplementedError

    async def step(self) -> Any:
        raise NotImplementedError

    async def stop(self) -> None:
        self._stopping.set()
        # Under the lock: a step in flight finishes (and commits) before its clients close; a step
        # that takes the lock after this finds no consumer and does nothing.
        async with self._lock:
            consumer, producer = self._consumer, self._producer
            self._consumer = self._producer = None
        # Closed outside the lock: aiokafka's close waits for the group's coordination task, which
        # may be running a rebalance listener that waits for this lock.
        if consumer is not None:
            await consumer.stop()
        if producer is not None:
            await producer.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run(self) -> None:
        """Run ``step`` until ``stop``; retryable errors pause and poll again, never end the loop."""
        while not self._stopping.is_set():
            try:
                await self.step()
            except ConsumerStoppedError:
                if self._stopping.is_set():
                    break  # stop() closed the consumer under a poll
                raise
            except self.retry_on as exc:
                if self._stopping.is_set():
                    break
                log.warning("%s: %r; retrying in %.1fs", self.name, exc, self.retry_pause_s)
                await asyncio.sleep(self.retry_pause_s)
