"""The /metrics page serves exactly what ``generate_latest`` would, without re-formatting every
series at each scrape."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import prometheus_client
import prometheus_client.metrics as client_metrics
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily

from monitoring.exposition import Exposition
from monitoring.metrics import ALL_WORLDS, Metrics, add_metrics_page


@pytest.fixture(autouse=True)
def created_off() -> Iterator[None]:
    """The worker's setting (``add_metrics_page``); restored after, since it is process-wide."""
    before = client_metrics._use_created
    prometheus_client.disable_created_metrics()
    yield
    client_metrics._use_created = before


def _worker_metrics(worlds: int) -> Metrics:
    m = Metrics()
    m.dead_letter_series(["onto.changes.objects", "onto.changes.links"])
    for w in range(worlds):
        world = f"world-{w}"
        m.committed(world, duration_s=0.3, rows=10, nbytes=4096, occurred_at=[1.0, 2.5, 400.0], at=100.0)
        m.event_outcome(world, "applied", 10)
        m.released(world, [0.2])
        m.idempotency(world, lookups=10, duplicates=1)
        m.inflight(world, 3, 50.0)
        m.dead_lettered("onto.changes.objects", "malformed-json", world=world)
    m.inflight(ALL_WORLDS, 5, 60.0)
    m.flush_started(0.4)
    m.dependency("redis", True)
    m.cdc_waiting_records(7)
    return m


def test_pages_equal_generate_latest_as_values_and_series_change() -> None:
    m, page = _worker_metrics(5), Exposition()
    assert page.render(m.registry) == generate_latest(m.registry)
    # Kept prefixes never freeze values, and series born or removed since show as they are now.
    m.committed("world-1", duration_s=7.0, rows=5000, nbytes=10**9, occurred_at=[0.0] * 7, at=1e9)
    m.event_outcome("world-new", "duplicate", 2)
    m.inflight("world-2", 0, None)  # removes its oldest-timestamp series
    m.dependency("redis", False)
    assert page.render(m.registry) == generate_latest(m.registry)


def test_what_is_not_a_plain_child_is_rendered_by_the_library() -> None:
    """Escaped label values, a gauge reading a function, a custom collector, a histogram with a
    negative first bound (no _sum line), a metric without labels: each byte as the library renders it."""
    registry = CollectorRegistry()
    odd = Counter("odd_total", 'Back\\slash and\nnewline "help".', ("v",), registry=registry)
    odd.labels('quote " back \\ new\nline').inc(2)
    Gauge("by_function", "A gauge set from a function.", registry=registry).set_function(lambda: 41.5)
    neg = Histogram("neg", "Negative bounds.", buckets=(-1.0, 0.0, 1.0), registry=registry)
    neg.observe(-3)
    Gauge("plain", "No labels.", registry=registry).set(float("nan"))

    class Custom:
        def collect(self) -> Iterator[Any]:
            family = GaugeMetricFamily("custom_value", "Custom.", labels=["k"])
            family.add_metric(["a"], 1e21)
            yield family

    registry.register(Custom())
    page = Exposition()
    assert page.render(registry) == generate_latest(registry)
    assert page.render(registry) == generate_latest(registry)


def test_created_series_switched_on_are_kept() -> None:
    prometheus_client.enable_created_metrics()
    registry = CollectorRegistry()
    Counter("c_total", "A counter.", registry=registry).inc()
    Histogram("h", "A histogram.", registry=registry).observe(0.2)
    assert b"_created" in generate_latest(registry)
    assert Exposition().render(registry) == generate_latest(registry)


def test_a_scrape_formats_no_known_series_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's /metrics page: once a series was served, the next scrape only reads its values
    (``generate_latest`` re-formats every line: ~80 ms of event-loop CPU at 100 worlds)."""
    pages: dict[str, Any] = {}

    class App:
        def page(self, pattern: str) -> Any:
            return lambda handler: pages.setdefault(pattern, handler)

    real = prometheus_client.generate_latest
    calls: list[Any] = []

    def counting(registry: Any = prometheus_client.REGISTRY, *args: Any) -> bytes:
        calls.append(registry)
        return real(registry, *args)

    for module in ("prometheus_client", "prometheus_client.exposition", "monitoring.exposition"):
        monkeypatch.setattr(f"{module}.generate_latest", counting)
    m = _worker_metrics(3)
    add_metrics_page(App(), m)
    assert asyncio.run(pages["/metrics"](None, None)).body == real(m.registry)
    calls.clear()
    m.committed("world-0", duration_s=1.0, rows=1, nbytes=1, occurred_at=[5.0], at=200.0)
    assert asyncio.run(pages["/metrics"](None, None)).body == real(m.registry)
    assert calls == []
