"""The lag exporter's broker reads (and the demo's drain wait) keep one consumer and one admin client across polls."""

from __future__ import annotations

import time

import click
import pytest
from aiokafka import AIOKafkaProducer

from cli.demo import _wait_drained
from monitoring.lag_exporter import LagMetrics, Watch, poll_once
from streams import lag_probe
from streams.lag_probe import OffsetProbe
from streams.settings import Settings
from streams.topics import ensure_topic

pytestmark = pytest.mark.integration


async def _one_record_and_counted_consumers(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, topic: str
) -> list[object]:
    """Publish one record to ``topic``'s partition 0; the list fills with every consumer the probe makes."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"v", key=b"k", partition=0)
    finally:
        await producer.stop()
    made: list[object] = []

    class Counted(lag_probe.AIOKafkaConsumer):  # type: ignore[misc]
        def __init__(self, *args: object, **kwargs: object) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(lag_probe, "AIOKafkaConsumer", Counted)
    return made


async def test_polls_share_one_pair_of_clients(monkeypatch: pytest.MonkeyPatch, unique: str) -> None:
    settings = Settings.from_env()
    topic = f"lagexp.{unique}"
    await ensure_topic(settings, topic, partitions=2)
    made = await _one_record_and_counted_consumers(monkeypatch, settings, topic)
    probe, metrics = OffsetProbe(settings.kafka_bootstrap), LagMetrics()
    watch = Watch((f"group-{unique}",), (topic,))
    try:
        for _ in range(3):
            result = await poll_once(probe, watch, metrics)
            rows = {r.partition: r for r in result[f"group-{unique}"]}
            assert (rows[0].lag, rows[1].lag) == (1, 0)
            assert rows[0].lag_seconds(time.time()) > 0  # the waiting record's timestamp was read
    finally:
        await probe.close()
    assert probe.opened == 1 and len(made) == 1


async def test_the_demo_waits_for_the_drain_on_one_pair_of_clients(
    monkeypatch: pytest.MonkeyPatch, unique: str
) -> None:
    """The demo polled the group's lag every 0.5 s through a one-shot probe: a consumer and an admin
    client bootstrapped per poll. A group that never commits its one record lags until the limit."""
    settings = Settings.from_env().replace(
        app_id=f"group-{unique}", objects_topic=f"lagdemo.{unique}", links_topic=f"lagdemo-links.{unique}"
    )
    for topic in (settings.objects_topic, settings.links_topic):
        await ensure_topic(settings, topic, partitions=1)
    made = await _one_record_and_counted_consumers(monkeypatch, settings, settings.objects_topic)
    with pytest.raises(click.ClickException, match=r"lag 1\)"):
        await _wait_drained(settings, total=1, limit_s=2.0)
    assert len(made) == 1
