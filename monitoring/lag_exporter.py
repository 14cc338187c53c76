"""The standalone lag exporter: consumer-group lag measured outside the workers.

A worker cannot report its own lag when it matters: stalled, stopped or dead, it answers no scrape and
its lag series vanish exactly while the lag grows. This process asks the broker every
``CAUSEWAY_LAG_POLL_INTERVAL_S`` for each watched group's committed offsets and each partition's end
offset (``streams.lag_probe``), computes lag with ``streams.lag`` and serves it on
``CAUSEWAY_LAG_EXPORTER_PORT``. It watches the groups of ``CAUSEWAY_LAG_GROUPS`` (default: the app id,
which is the workers' group) on the topics of ``CAUSEWAY_LAG_TOPICS`` (default: the objects and links
topics) plus every topic the group has committed offsets for, so a partition no worker owns still
shows its lag.

Every gauge is set from the poll that just succeeded; ``causeway_lag_exporter_last_success_timestamp_
seconds`` says when that was, so a stuck exporter shows as an age in PromQL, never as a frozen lag that
looks fine. A failed poll sets ``causeway_dependency_up{dependency="kafka"}`` to 0 and leaves the
last values (with their timestamp) in place.

Example::

    python -m monitoring.lag_exporter                         # scripts/services.sh starts it this way
    python -m monitoring.lag_exporter --once --json --group causeway
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from monitoring import discovery
from monitoring.metrics import MetricInfo, serve
from streams.lag import PartitionOffsets
from streams.lag_probe import OffsetProbe
from streams.security import kafka_client_options
from streams.settings import Settings, SettingsError

log = logging.getLogger("causeway.lag_exporter")


class LagMetrics:
    """The exporter's metrics, on their own registry (it exports nothing of the worker's)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.catalog: list[MetricInfo] = []
        self.lag_messages = self._gauge(
            "causeway_consumer_lag_messages",
            "Messages a consumer group has not committed (end offset minus committed offset), per partition; "
            "from the lag exporter.",
            ("group", "topic", "partition"),
        )
        self.lag_seconds = self._gauge(
            "causeway_consumer_lag_seconds",
            "Seconds the oldest record a group has not committed has waited since it was written (0 when "
            "caught up), per partition; from the lag exporter.",
            ("group", "topic", "partition"),
        )
        self.committed_offset = self._gauge(
            "causeway_partition_committed_offset",
            "Offset a consumer group has committed for a partition (next offset to read; the earliest retained "
            "offset if it never committed).",
            ("group", "topic", "partition"),
        )
        self.end_offset = self._gauge(
            "causeway_partition_end_offset",
            "Log end offset of a partition (next offset to be written).",
            ("topic", "partition"),
        )
        self.last_success = self._gauge(
            "causeway_lag_exporter_last_success_timestamp_seconds",
            "Unix time of the lag exporter's last successful poll of the broker.",
            (),
        )
        self.polls = Counter(
            "causeway_lag_exporter_polls",
            "Lag exporter polls of the broker by outcome: ok, failed.",
            ("outcome",),
            registry=self.registry,
        )
        self.catalog.append(
            MetricInfo("causeway_lag_exporter_polls_total", "counter", ("outcome",), self.polls._documentation)
        )
        for outcome in ("ok", "failed"):
            self.polls.labels(outcome)
        self.dependency_up = self._gauge(
            "causeway_dependency_up",
            "1 if the last probe of a dependency succeeded, else 0 (the lag exporter probes kafka).",
            ("dependency",),
        )
        self._series: set[tuple[str, str, str]] = set()

    def _gauge(self, name: str, doc: str, labels: tuple[str, ...]) -> Gauge:
        self.catalog.append(MetricInfo(name, "gauge", labels, doc))
        return Gauge(name, doc, labels, registry=self.registry)

    def record(self, group: str, rows: Sequence[PartitionOffsets], now: float) -> None:
        """Set one group's gauges from a poll; drop the series of partitions it no longer has."""
        seen = set()
        for r in rows:
            key = (group, r.topic, str(r.partition))
            seen.add(key)
            self.lag_messages.labels(*key).set(r.lag)
            self.lag_seconds.labels(*key).set(r.lag_seconds(now))
            self.committed_offset.labels(*key).set(r.position)
            self.end_offset.labels(r.topic, str(r.partition)).set(r.end)
        for key in {k for k in self._series if k[0] == group} - seen:
            for metric in (self.lag_messages, self.lag_seconds, self.committed_offset):
                metric.remove(*key)
        self._series = {k for k in self._series if k[0] != group} | seen

    def succeeded(self, now: float) -> None:
        self.polls.labels("ok").inc()
        self.last_success.set(now)
        self.dependency_up.labels("kafka").set(1)

    def failed(self) -> None:
        self.polls.labels("failed").inc()
        self.dependency_up.labels("kafka").set(0)


@dataclass(frozen=True)
class Watch:
    """What the exporter watches: groups, and topics watched for every group."""

    groups: tuple[str, ...]
    topics: tuple[str, ...]

    @classmethod
    def from_settings(cls, settings: Settings) -> Watch:
        groups = _csv(settings.lag_groups) or (settings.app_id,)
        topics = _csv(settings.lag_topics) or (settings.objects_topic, settings.links_topic)
        return cls(groups, topics)


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


async def poll(probe: OffsetProbe, watch: Watch) -> dict[str, list[PartitionOffsets]]:
    """One look at the broker: every watched group's offsets on its topics, with waiting-record times."""
    out = {}
    for group in watch.groups:
        topics = set(watch.topics) | await probe.committed_topics(group)
        out[group] = await probe.offsets(group, await probe.partitions(topics), with_times=True)
    return out


async def poll_once(probe: OffsetProbe, watch: Watch, metrics: LagMetrics) -> dict[str, list[PartitionOffsets]]:
    """Poll and record; on failure mark Kafka down, keep the last values, and re-raise."""
    try:
        result = await poll(probe, watch)
    except Exception:
        metrics.failed()
        raise
    now = time.time()
    for group, rows in result.items():
        metrics.record(group, rows, now)
    metrics.succeeded(now)
    return result


async def run(settings: Settings, watch: Watch, stop: asyncio.Event) -> None:
    """Poll every ``lag_poll_interval_s`` until ``stop`` is set."""
    probe = OffsetProbe(settings.kafka_bootstrap, kafka_options=kafka_client_options(settings))
    metrics = LagMetrics()
    server = serve(metrics, settings.lag_exporter_port, settings.web_bind)
    target = discovery.advertised_address(settings.web_bind, settings.lag_exporter_port)
    entry = discovery.register(settings.prometheus_sd_dir, "lag-exporter", target)
    log.info("lag exporter on http://%s/metrics: groups %s, topics %s", target, watch.groups, watch.topics)
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(
                    poll_once(probe, watch, metrics), timeout=max(10.0, settings.lag_poll_interval_s)
                )
            except Exception as exc:  # noqa: BLE001 - a broker outage must not stop the exporter
                log.warning("lag poll failed: %s: %s", type(exc).__name__, exc)
                await probe.close()
            try:
                await asyncio.wait_for(stop.wait(), timeout=settings.lag_poll_interval_s)
            except TimeoutError:
                pass
    finally:
        discovery.unregister(entry)
        await probe.close()
        server.shutdown()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m monitoring.lag_exporter",
        description="Serve consumer-group lag measured from the broker on /metrics, for Prometheus.",
        epilog="example: python -m monitoring.lag_exporter --group causeway --port 6065",
    )
    p.add_argument("--group", action="append", help="consumer group to watch (repeatable; default CAUSEWAY_LAG_GROUPS)")
    p.add_argument("--topic", action="append", help="topic to watch (repeatable; default CAUSEWAY_LAG_TOPICS)")
    p.add_argument("--port", type=int, help="HTTP port (default CAUSEWAY_LAG_EXPORTER_PORT)")
    p.add_argument("--once", action="store_true", help="poll once, print the lag and exit (no server)")
    p.add_argument("--json", action="store_true", help="with --once: print JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.port:
        settings = settings.replace(lag_exporter_port=args.port)
    watch = Watch.from_settings(settings)
    watch = Watch(tuple(args.group or watch.groups), tuple(args.topic or watch.topics))
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)  # one assign() per poll is not news
    if args.once:
        return _once(settings, watch, as_json=args.json)
    stop = asyncio.Event()

    async def _main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(settings, watch, stop)

    try:
        asyncio.run(_main())
    except OSError as exc:
        print(f"error: cannot serve on port {settings.lag_exporter_port}: {exc}", file=sys.stderr)
        return 1
    return 0


def _once(settings: Settings, watch: Watch, *, as_json: bool) -> int:
    async def go() -> dict[str, list[PartitionOffsets]]:
        probe = OffsetProbe(settings.kafka_bootstrap, kafka_options=kafka_client_options(settings))
        try:
            return await poll(probe, watch)
        finally:
            await probe.close()

    try:
        result = asyncio.run(go())
    except Exception as exc:  # noqa: BLE001 - one clear line instead of a traceback
        print(
            f"error: cannot read offsets from {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return 1
    now = time.time()
    rows = [
        {"group": g, "topic": r.topic, "partition": r.partition, "end": r.end, "committed": r.committed,
         "lag": r.lag, "lag_seconds": round(r.lag_seconds(now), 3)}
        for g, rs in result.items() for r in rs
    ]  # fmt: skip
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            where = f"{row['group']:<24} {row['topic']:<32} {row['partition']:>4}"
            print(f"{where} lag {row['lag']:>8} {row['lag_seconds']:>8.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
