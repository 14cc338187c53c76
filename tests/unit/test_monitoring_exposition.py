"""The /metrics page serves exactly what ``generate_latest`` would, without re-formatting every
series at each scrape."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import prometheus_client
import prometheus_client.metrics as client_metrics
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.samples import Sample

from monitoring import exposition
from monitoring.exposition import Exposition, Private
from monitoring.lag_exporter import LagMetrics
from monitoring.metrics import ALL_WORLDS, Metrics, add_metrics_page
from streams.lag import PartitionOffsets


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


def _counting_generate_latest(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The collectors ``generate_latest`` is called on from here on (through the exposition module)."""
    real, calls = generate_latest, []

    def counting(registry: Any = prometheus_client.REGISTRY, *args: Any) -> bytes:
        calls.append(registry)
        return real(registry, *args)

    monkeypatch.setattr(exposition, "generate_latest", counting)
    return calls


def _every_shape() -> CollectorRegistry:
    """The worker's metrics plus what else the project exposes: labelled and plain counters, gauges
    and histograms, label values needing escaping, removed and cleared children, non-finite values."""
    m = _worker_metrics(4)
    odd = Counter("odd_total", "Escaped label values.", ("v", "w"), registry=m.registry)
    odd.labels('quote " back \\ new\nline', "ünï").inc(2)
    odd.labels("removed", "x").inc()
    odd.remove("removed", "x")
    g = Gauge("values", "Non-finite and large values.", ("k",), registry=m.registry)
    for k, v in (("nan", float("nan")), ("inf", float("inf")), ("ninf", float("-inf")), ("big", 1e21), ("neg", -0.5)):
        g.labels(k).set(v)
    cleared = Histogram("cleared_seconds", "Cleared, then observed again.", ("k",), registry=m.registry)
    cleared.labels("old").observe(1)
    cleared.clear()
    cleared.labels("new").observe(float("inf"))
    lag = LagMetrics(CollectorRegistry())  # its gauges drop the series of partitions that went away
    lag.record("g", [PartitionOffsets("t", p, 10, 0, 4) for p in range(3)], now=100.0)
    lag.record("g", [PartitionOffsets("t", 1, 12, 0, None)], now=101.0)
    for metric in (lag.lag_messages, lag.committed_offset, lag.end_offset):
        m.registry.register(metric)
    return m.registry


def test_every_shape_the_project_exposes_is_byte_for_byte_the_librarys_and_read_fast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry, page = _every_shape(), Exposition()
    assert page.render(registry) == generate_latest(registry)
    calls = _counting_generate_latest(monkeypatch)
    assert page.render(registry) == generate_latest(registry)
    assert calls == [], "a known series was formatted again, or the page fell back to generate_latest"
    # Children removed, cleared and born between scrapes show as they are now.
    odd = registry._names_to_collectors["odd_total"]
    odd.remove('quote " back \\ new\nline', "ünï")
    odd.labels("new\n", "").inc(1e-9)
    registry._names_to_collectors["values"].clear()
    registry._names_to_collectors["cleared_seconds"].labels("new").observe(0.2)
    assert page.render(registry) == generate_latest(registry)
    # A child removed and labelled again is a new child (its own value); a gauge switched to a function.
    registry._names_to_collectors["cleared_seconds"].remove("new")
    registry._names_to_collectors["cleared_seconds"].labels("new").observe(5.0)
    registry._names_to_collectors["causeway_cdc_waiting_messages"].set_function(lambda: 12.5)
    assert page.render(registry) == generate_latest(registry)


@pytest.mark.parametrize("attribute", [f.name for f in dataclasses.fields(Private)])
def test_a_private_attribute_a_later_library_lacks_is_rendered_by_the_library(
    attribute: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prometheus_client release that renames any private attribute the page reads: the page is
    still the library's, never an AttributeError or a wrong value."""
    monkeypatch.setattr(exposition, "PRIVATE", dataclasses.replace(exposition.PRIVATE, **{attribute: "_gone"}))
    registry, page = _every_shape(), Exposition()
    assert page.render(registry) == generate_latest(registry)
    registry._names_to_collectors["values"].labels("later").set(3)
    assert page.render(registry) == generate_latest(registry)


@pytest.mark.parametrize("kind", [Counter, Gauge, Histogram])
def test_private_attributes_that_read_differently_from_the_library_are_not_trusted(
    kind: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A release keeping the attributes' names but not their meaning (here: the exposed value is no
    longer the stored one) would have served wrong values without an error (failed before: the
    page read the stored value); the check on a registry of every shape hands the page to the library."""
    real = kind._child_samples

    def changed(self: Any) -> tuple[Sample, ...]:
        return tuple(s._replace(value=s.value + 1) for s in real(self))

    monkeypatch.setattr(kind, "_child_samples", changed)
    registry, page = _every_shape(), Exposition()
    with caplog.at_level(logging.WARNING, "monitoring.exposition"):
        assert page.render(registry) == generate_latest(registry)
        assert page.render(registry) == generate_latest(registry)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "rendered by generate_latest" in caplog.records[0].message


def test_a_check_that_cannot_build_its_registry_leaves_the_page_to_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> CollectorRegistry:
        raise TypeError("Histogram() got an unexpected keyword argument 'buckets'")

    monkeypatch.setattr(exposition, "_shapes", broken)
    registry = _every_shape()
    calls = _counting_generate_latest(monkeypatch)
    assert Exposition().render(registry) == generate_latest(registry)
    assert calls == [registry]  # the whole page, by the library


def test_a_scrape_formats_only_the_values_that_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two scrapes most series keep their values (100 worlds: a world's histograms move
    when it commits): their lines are reused, only moved values are formatted again."""
    m, page = _worker_metrics(100), Exposition()
    assert page.render(m.registry) == generate_latest(m.registry)
    formatted: list[float] = []
    real = exposition.floatToGoString

    def counting(value: float) -> str:
        formatted.append(value)
        return real(value)

    monkeypatch.setattr(exposition, "floatToGoString", counting)
    assert page.render(m.registry) == generate_latest(m.registry)
    assert formatted == []
    m.event_outcome("world-7", "applied", 3)  # one counter series moves: its one line is formatted
    assert page.render(m.registry) == generate_latest(m.registry)
    assert formatted == [13.0]


def test_a_value_equal_as_a_float_but_written_apart_is_formatted_again() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("signed", "Zero and minus zero.", registry=registry)
    page = Exposition()
    for value in (0.0, -0.0, float("nan"), float("nan"), 0.0):
        gauge.set(value)
        assert page.render(registry) == generate_latest(registry)
