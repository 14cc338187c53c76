"""Publishing dead letters: a batch goes out together and is confirmed before any offset is acked."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from models.deadletter import DeadLetter

log = logging.getLogger(__name__)


class DeadLetterPublisher:
    """Sends DeadLetter records to the DLQ topic with their reason headers (acks=all, idempotent)."""

    def __init__(self, bootstrap: str, topic: str, kafka_options: dict[str, Any] | None = None) -> None:
        self.topic = topic
        self._options = kafka_options or {}  # streams.security.kafka_client_options
        self._bootstrap = bootstrap
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        # aiokafka binds to the running loop, so the producer is made here, not in __init__.
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self._bootstrap,
                acks="all",
                enable_idempotence=True,
                linger_ms=5,
                max_request_size=8 * 1024 * 1024,
                **self._options,
            )
            await producer.start()
            self._producer = producer

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def publish(self, letters: Sequence[DeadLetter]) -> None:
        """Send all letters and wait until the broker has every one; raises if any send failed."""
        if not letters:
            return
        await self.start()
        assert self._producer is not None
        futures = [
            await self._producer.send(self.topic, value=dl.value, key=dl.key, headers=dl.headers()) for dl in letters
        ]
        await asyncio.gather(*futures)
        reasons = Counter(dl.reason for dl in letters)
        log.info("dead-lettered %d record(s) to %s: %s", len(letters), self.topic, dict(reasons))
        for dl in letters:
            log.debug(
                "dead letter %s[%d]@%d: %s (%s)",
                dl.topic,
                dl.partition,
                dl.offset,
                dl.reason,
                dl.detail[:200],
            )
