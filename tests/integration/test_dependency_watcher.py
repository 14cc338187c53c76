"""The worker's dependency watcher probes Nessie over one kept connection, and still sees it go down.

A fresh Nessie client per probe built a TLS context and an HTTP pool every round (~47 ms of the
event loop's CPU every 5 s in a worker, docs/benchmarks.md); the watcher keeps one client, so a
round is one request on an open connection. Nessie is reached through a proxy the test counts
connections on, cuts and restores (the shared server keeps running).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from agents.probes import dependency_watcher
from monitoring.health import Health
from streams.settings import Settings
from tests.integration.proxy import proxied

pytestmark = pytest.mark.integration


def _nessie(health: Health) -> str:
    [dep] = [d for d in health.report().dependencies if d.name == "nessie"]
    return dep.verdict


async def _until(check: Callable[[], bool], timeout: float = 20.0) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the watcher never reported it"
        await asyncio.sleep(0.05)


async def test_the_watcher_keeps_one_nessie_connection_and_still_sees_an_outage() -> None:
    base = Settings.from_env()
    proxy, url = proxied(base.nessie_url)
    health = Health()
    rounds = 0

    def stopping() -> bool:
        nonlocal rounds
        rounds += 1  # asked once before each round
        return False

    watch = dependency_watcher(health, base.replace(nessie_url=url), stopping, interval_s=0.05, timeout_s=2.0)
    task = asyncio.create_task(watch())
    try:
        await _until(lambda: rounds >= 6)
        assert _nessie(health) == "up"
        assert proxy.accepted == 1, f"{proxy.accepted} connections to Nessie for {rounds - 1} probe rounds"

        proxy.cut()
        await _until(lambda: _nessie(health) == "down")
        proxy.restore()
        await _until(lambda: _nessie(health) == "up")
    finally:
        task.cancel()
        proxy.close()


def _verdict(health: Health, name: str) -> str:
    [dep] = [d for d in health.report().dependencies if d.name == name]
    return dep.verdict


async def test_the_watcher_keeps_one_kafka_and_one_redis_connection_and_finds_redis_again() -> None:
    """Failed before: every round bootstrapped a new Kafka client and connected a new Redis client
    (6 rounds: 6 connections to each). Kafka's bootstrap and Redis are reached through proxies that
    count the connections; Redis is cut and restored there (the shared server keeps running)."""
    base = Settings.from_env()
    kafka_proxy, bootstrap = proxied(f"kafka://{base.kafka_bootstrap}")
    redis_proxy, redis_url = proxied(base.redis_url.reveal())
    settings = base.replace(kafka_bootstrap=bootstrap.removeprefix("kafka://"), redis_url=redis_url)
    health = Health()
    rounds = 0

    def stopping() -> bool:
        nonlocal rounds
        rounds += 1
        return False

    task = asyncio.create_task(dependency_watcher(health, settings, stopping, interval_s=0.05, timeout_s=2.0)())
    try:
        await _until(lambda: rounds >= 7)
        assert (_verdict(health, "kafka"), _verdict(health, "redis")) == ("up", "up")
        assert kafka_proxy.accepted == 1, f"{kafka_proxy.accepted} Kafka bootstraps for {rounds - 1} rounds"
        assert redis_proxy.accepted == 1, f"{redis_proxy.accepted} Redis connections for {rounds - 1} rounds"

        redis_proxy.cut()
        await _until(lambda: _verdict(health, "redis") == "down")
        assert _verdict(health, "kafka") == "up"
        redis_proxy.restore()
        await _until(lambda: _verdict(health, "redis") == "up")
        back = rounds
        await _until(lambda: rounds >= back + 5)
        assert _verdict(health, "redis") == "up"
        # One connection again after the outage, kept: not one per round since.
        assert redis_proxy.accepted == 2, f"{redis_proxy.accepted} Redis connections"
        assert kafka_proxy.accepted == 1
    finally:
        task.cancel()
        kafka_proxy.close()
        redis_proxy.close()


async def test_the_kafka_probe_asks_a_broker_for_no_topics_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    # The probe read the metadata of every topic in the cluster each round (39 ms of the worker's CPU
    # every 5 s at 1,035 topics, growing with the cluster). Failed before: its request asked for all
    # topics (None).
    from aiokafka.conn import AIOKafkaConnection
    from aiokafka.protocol.metadata import MetadataRequest

    from agents.probes import kept_kafka, probe_kafka

    settings = Settings.from_env()
    kafka = kept_kafka(settings, 5.0)
    try:
        assert (await probe_kafka(settings, 5.0, kafka)).ok  # bootstraps the kept client
        asked: list[list[str] | None] = []
        answered: list[int] = []
        real = AIOKafkaConnection.send

        def send(self: AIOKafkaConnection, request: object, *args: object, **kwargs: object) -> object:
            if isinstance(request, MetadataRequest):
                asked.append(request._topics)  # noqa: SLF001 - what the probe asked for
                sent = real(self, request, *args, **kwargs)

                async def counted() -> object:
                    answer = await sent  # type: ignore[misc]
                    answered.append(len(answer.topics))
                    return answer

                return counted()
            return real(self, request, *args, **kwargs)

        monkeypatch.setattr(AIOKafkaConnection, "send", send)
        result = await probe_kafka(settings, 5.0, kafka)
        assert result.ok, result
        assert asked == [[]] and answered == [0]
    finally:
        await kafka.reset()
