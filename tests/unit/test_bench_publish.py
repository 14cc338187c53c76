"""The benchmark's publisher retries a send the broker's full buffer timed out, and gives up in time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from bench import publish


class _Producer:
    def __init__(self, timeouts: int) -> None:
        self.timeouts = timeouts
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        if self.timeouts:
            self.timeouts -= 1
            raise KafkaTimeoutError()
        self.sent.append((topic, value, key))
        return len(self.sent)


def test_a_send_that_timed_out_is_sent_again_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish.asyncio, "sleep", _no_sleep)
    producer = _Producer(timeouts=2)
    fut = asyncio.run(publish.send(producer, "t", b"v", key=b"k"))
    assert producer.sent == [("t", b"v", b"k")]
    assert fut == 1


def test_a_broker_that_never_takes_the_record_is_the_runs_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish.asyncio, "sleep", _no_sleep)
    producer = _Producer(timeouts=10)
    with pytest.raises(KafkaTimeoutError):
        asyncio.run(publish.send(producer, "t", b"v", key=None, attempts=3))
    assert producer.sent == []
    assert producer.timeouts == 7


async def _no_sleep(_: float) -> None:
    return None
