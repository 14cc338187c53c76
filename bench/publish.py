"""Publishing the benchmark's records: a send the broker cannot take in time is retried, not fatal.

aiokafka's ``send`` raises ``KafkaTimeoutError`` when its buffer stays full for a request timeout
(a broker behind under load: the 1M-record ``full`` profile on a shared box, 2026-12-02). The record
was not appended then, so sending it again neither loses nor duplicates it; a benchmark that died
there lost a 30-minute run for one slow second.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from aiokafka.errors import KafkaTimeoutError

#: Attempts per record before the timeout is the run's error.
SEND_ATTEMPTS = 5


async def send(producer: Any, topic: str, value: bytes, *, key: bytes | None, attempts: int = SEND_ATTEMPTS) -> Any:
    """``producer.send`` that retries a full buffer's timeout; returns the delivery future."""
    for attempt in range(1, attempts + 1):
        try:
            return await producer.send(topic, value, key=key)
        except KafkaTimeoutError:
            if attempt == attempts:
                raise
            print(
                f"[bench] the broker took no record for a request timeout ({attempt}/{attempts}); retrying",
                file=sys.stderr,
                flush=True,
            )
            await asyncio.sleep(min(2.0, 0.25 * attempt))
    raise AssertionError("unreachable")
