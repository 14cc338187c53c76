"""Publishing dead letters: a batch goes out together and is confirmed before any offset is acked."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.letter_marks import Decisions, letter_keys
from models.deadletter import DeadLetter
from streams.kafka import topic_partitions
from streams.settings import Settings

log = logging.getLogger(__name__)

#: A dead letter's key, value and headers together stay under this many bytes, below the broker's
#: default 1 MB record limit even with the record batch overhead (the CDC ingest uses the same cap).
#: A near-limit rejected record plus our headers would otherwise be refused by the broker on every
#: attempt and stall the worker.
MAX_LETTER_BYTES = 900_000


def letter_size(letter: DeadLetter) -> int:
    """Bytes of the record a letter becomes: key, value and every header."""
    headers = sum(len(k.encode()) + len(v) for k, v in letter.headers())
    return len(letter.key or b"") + len(letter.value or b"") + headers


def fit(letter: DeadLetter, limit: int = MAX_LETTER_BYTES) -> DeadLetter:
    """``letter`` itself if it fits in ``limit`` bytes, else without its value (then without the
    producer's own headers, then its key); the detail says what was left out and where the
    original still is, so an operator can re-read it from the source partition."""
    if letter_size(letter) <= limit:
        return letter
    where = f"{letter.topic}/{letter.partition}@{letter.offset}"
    dropped = [f"value of {len(letter.value or b'')} bytes"]
    out = replace(letter, value=None)
    if letter_size(out) > limit:
        dropped.append(f"{len(out.original_headers)} original header(s)")
        out = replace(out, original_headers=[])
    if letter_size(out) > limit:
        dropped.append(f"key of {len(out.key or b'')} bytes")
        out = replace(out, key=None)
    note = f" ({' and '.join(dropped)} omitted to fit the dead-letter topic; re-read it from {where})"
    return replace(out, detail=out.detail[: 1000 - len(note)] + note)


class DeadLetterPublisher:
    """Sends DeadLetter records to the DLQ topic with their reason headers (acks=all, idempotent)."""

    def __init__(self, bootstrap: str, topic: str, kafka_options: dict[str, Any] | None = None) -> None:
        self.topic = topic
        self._options = kafka_options or {}  # streams.security.kafka_client_options
        self._bootstrap = bootstrap
        self._producer: AIOKafkaProducer | None = None
        # A poll and a flush settling without the applier's lock may publish at once: one producer.
        self._starting = asyncio.Lock()

    async def start(self) -> None:
        # aiokafka binds to the running loop, so the producer is made here, not in __init__.
        if self._producer is not None:
            return
        async with self._starting:
            if self._producer is not None:
                return
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
        letters = [fit(dl) for dl in letters]
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

    async def letter_keys_since(self, since_ms: int) -> set[str]:
        """Decision keys (``agents.letter_marks.letter_keys``) of every letter in the topic stamped
        at or after ``since_ms``: which pending decisions did go out before their worker died.

        Reads each partition from its first offset at ``since_ms`` (``offsets_for_times``) to the end
        offset seen at the start: a recovery path, run only when a decision was found pending.
        """
        consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False, **self._options)
        try:
            await consumer.start()
            tps = [TopicPartition(self.topic, p) for p in sorted(await topic_partitions(consumer, self.topic))]
            if not tps:
                return set()
            ends = await consumer.end_offsets(tps)
            starts = await consumer.offsets_for_times(dict.fromkeys(tps, max(0, since_ms)))
            consumer.assign(tps)
            todo: dict[TopicPartition, int] = {}
            for tp in tps:
                start = starts.get(tp)
                if start is not None and start.offset < ends[tp]:
                    consumer.seek(tp, start.offset)
                    todo[tp] = ends[tp]
                else:
                    consumer.pause(tp)
            keys: set[str] = set()
            idle = 0
            while todo and idle < 30:  # a partition that yields nothing for 30 s: give up on it
                batch = await consumer.getmany(*todo, timeout_ms=1000, max_records=5000)
                idle = 0 if batch else idle + 1
                for tp, records in batch.items():
                    for r in records:
                        if r.offset < todo.get(tp, -1):
                            keys.update(letter_keys(DeadLetter.from_record(r.key, r.value, list(r.headers))))
                for tp in list(todo):
                    if await consumer.position(tp) >= todo[tp]:
                        consumer.pause(tp)
                        del todo[tp]
            return keys
        finally:
            await consumer.stop()


def decisions_from_settings(settings: Settings) -> Decisions:
    """The dead-letter decisions every dead-lettering path shares: Redis, plus a reader of the DLQ topic."""
    from agents.marks import DeadLetterMarks  # redis client only where decisions are used
    from streams.security import kafka_client_options, redis_options

    marks = DeadLetterMarks.from_url(settings.redis_url, settings.dedupe_ttl_s, **redis_options(settings))
    reader = DeadLetterPublisher(settings.kafka_bootstrap, settings.dlq_topic, kafka_client_options(settings))
    return Decisions(marks, reader.letter_keys_since)
