"""The /metrics page: the same bytes as prometheus_client's ``generate_latest``, at a fifth of its CPU.

Why: Prometheus scrapes a worker every few seconds (2 s in this project's config), and
``generate_latest`` rebuilds every series' line from scratch: ``collect()`` makes a ``Sample`` and a
labels dict per line, then each line's labels are sorted, escaped and formatted again. A worker
serving 100 worlds exposes ~4,800 lines: 80 ms of event-loop CPU per scrape (docs/benchmarks.md,
"the worker's CPU per flush outside the committer"), half the main thread's CPU at 1,000 events/s.

Here a line's text up to its value is a pure function of the series (name, label values and, for
a histogram bucket, its bound), so it is rendered once, by ``generate_latest`` itself on a one-line
family (the escaping and label order are the library's), and kept; a scrape then reads the
children's current values and appends them (formatted by the library's ``floatToGoString``).

The library has no public reader of a registry's collectors or of a metric's children and their
values, so those are read from its private attributes, all named in ``PRIVATE`` (as of
prometheus_client 0.26; a metric's name, help and type come from the public ``describe()``).
Whatever is not as expected is rendered by ``generate_latest`` itself, so the page is never wrong,
only slower: a missing private attribute, anything but a plain Counter, Gauge or Histogram (another
collector, ``_created`` series switched on, a gauge with ``set_function``, a registry with target
info), and, checked once per ``Exposition`` on a registry of its own, a library whose private
attributes are there but read differently from how ``generate_latest`` reads them
(``tests/unit/test_monitoring_exposition.py`` compares the two byte for byte).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import prometheus_client.metrics as client_metrics
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.utils import floatToGoString

log = logging.getLogger(__name__)

#: Kept line prefixes above this many are dropped (and rebuilt as scraped): label values are
#: bounded by design (monitoring.metrics), this only bounds a registry that is not.
MAX_PREFIXES = 200_000

_MISSING = object()


@dataclass(frozen=True)
class Private:
    """The names of prometheus_client's private attributes this module reads."""

    registry_collectors: str = "_collector_to_names"  # CollectorRegistry: collectors in collect() order
    registry_lock: str = "_lock"
    registry_target_info: str = "_target_info"  # set: collect() adds a target_info family first
    created_switch: str = "_use_created"  # prometheus_client.metrics: _created series on or off
    children: str = "_metrics"  # a labelled metric's children by label values
    children_lock: str = "_lock"
    label_names: str = "_labelnames"
    value: str = "_value"  # Counter and Gauge child: .get() is the line's value
    buckets: str = "_buckets"  # Histogram child: per-bucket (not cumulative) counts, .get() each
    sum: str = "_sum"
    bounds: str = "_upper_bounds"
    samples_override: str = "_child_samples"  # in a gauge's own __dict__ once set_function replaced it


PRIVATE = Private()


class _Unreadable(Exception):
    """A private attribute is missing or not of the expected kind: ``generate_latest`` renders it."""


def _get(obj: Any, name: str) -> Any:
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        raise _Unreadable(name)
    return value


class _One:
    """A collector of one metric family (``generate_latest`` renders any object with ``collect``)."""

    def __init__(self, family: Any) -> None:
        self._family = family

    def collect(self) -> Iterator[Any]:
        yield self._family


class _Families:
    """A collector's families, for ``generate_latest``."""

    def __init__(self, collector: Any) -> None:
        self._collector = collector

    def collect(self) -> Iterable[Any]:
        return self._collector.collect()


def _suffixes(metric: Any, child: Any) -> list[tuple[str, dict[str, str]]]:
    """The (suffix, extra labels) of a child's lines, in the order its ``_child_samples`` yields them."""
    if isinstance(metric, Histogram):
        bounds = _get(child, PRIVATE.bounds)
        out = [("_bucket", {"le": floatToGoString(b)}) for b in bounds] + [("_count", {})]
        return out + [("_sum", {})] if bounds[0] >= 0 else out
    return [("_total" if isinstance(metric, Counter) else "", {})]


class Exposition:
    """Renders a registry in the text format; keeps each series' line prefix between scrapes."""

    def __init__(self) -> None:
        # By the metric's id, holding the metric itself: an id is not reused while its entries live.
        self._heads: dict[int, tuple[Any, str]] = {}
        # By (metric id, label values): the child, its value reader, its lines' prefixes and its
        # lines as last rendered.
        self._series: dict[tuple[int, tuple[str, ...]], _Series] = {}
        # None: not checked yet (checked at the first render with _created series off).
        self._reads_as_library: bool | None = None

    def render(self, registry: CollectorRegistry) -> bytes:
        """The page ``generate_latest(registry)`` would serve now."""
        if not self._fast_path_checked():
            return generate_latest(registry)
        return self._render(registry)

    def _render(self, registry: Any) -> bytes:
        try:
            collectors = _collectors(registry)
        except _Unreadable:
            return generate_latest(registry)
        out: list[str] = []
        for collector in collectors:
            if not self._render_fast(collector, out):
                out.append(generate_latest(_Families(collector)).decode())
        return "".join(out).encode()

    def _fast_path_checked(self) -> bool:
        """Whether this library's private attributes read as ``generate_latest`` reads them, checked
        once on a registry of every shape the project uses (a library whose attributes kept their
        names but changed meaning would otherwise serve wrong values without a single error)."""
        if self._reads_as_library is None and getattr(client_metrics, PRIVATE.created_switch, True) is False:
            try:
                registry = _shapes()
                self._reads_as_library = self._render(registry) == generate_latest(registry)
            except Exception:  # noqa: BLE001 - a library this check cannot even build is not trusted either
                log.debug("the exposition check failed", exc_info=True)
                self._reads_as_library = False
            self._heads.clear()
            self._series.clear()
            if not self._reads_as_library:
                log.warning(
                    "prometheus_client %s keeps metric values differently: /metrics is rendered by "
                    "generate_latest (correct, about five times the CPU per scrape)",
                    _library_version(),
                )
        return self._reads_as_library is not False

    def _render_fast(self, metric: Any, out: list[str]) -> bool:
        """Append ``metric``'s lines to ``out``; False (nothing appended) if it is not readable here."""
        kind = type(metric)
        if kind not in (Counter, Gauge, Histogram) or getattr(client_metrics, PRIVATE.created_switch, True):
            return False
        try:
            lines = self._lines(metric, kind)
        except _Unreadable:
            return False
        out += lines
        return True

    def _lines(self, metric: Any, kind: type) -> list[str]:
        if _get(metric, PRIVATE.label_names):
            lock, children = _get(metric, PRIVATE.children_lock), _get(metric, PRIVATE.children)
            if not isinstance(children, dict):
                raise _Unreadable(PRIVATE.children)
            with lock:
                series = list(children.items())
        else:
            series = [((), metric)]
        key = id(metric)
        kept = self._heads.get(key)
        if kept is None:
            kept = self._heads[key] = (metric, self._line_texts(metric, [])[0])
        lines = [kept[1]]
        # set_function replaces a gauge child's samples after the fact: looked for at every scrape.
        override = PRIVATE.samples_override if kind is Gauge else None
        for labels, child in series:
            entry = self._series.get((key, labels))
            if entry is None or entry.child is not child:  # new, or removed and labelled again since
                if len(self._series) >= MAX_PREFIXES:
                    self._series.clear()
                prefixes = entry.prefixes if entry is not None else self._line_texts(metric, [(labels, child)])[1]
                entry = self._series[(key, labels)] = _Series(child, _reader(kind, child), prefixes)
            elif override is not None and override in vars(child):
                raise _Unreadable(override)
            values = entry.read()
            # Most series do not move between two scrapes (100 worlds: each world's histograms
            # change only when it commits): their lines are reused, not formatted again. Compared
            # by their bits, so -0.0 after 0.0 (equal as floats, formatted apart) is formatted again.
            bits = array("d", values).tobytes()
            if bits != entry.bits:
                texts = [p + floatToGoString(v) + "\n" for p, v in zip(entry.prefixes, values, strict=True)]
                entry.text = "".join(texts)
                entry.bits = bits
            lines.append(entry.text)
        return lines

    @staticmethod
    def _line_texts(metric: Any, series: list[tuple[tuple[str, ...], Any]]) -> tuple[str, list[str]]:
        """The HELP/TYPE lines of ``metric`` and its lines' prefixes (up to the value) for ``series``,
        rendered by ``generate_latest`` on a family holding those lines at value 0."""
        [family] = metric.describe()  # name, help and type, without samples
        for labels, child in series:
            base = dict(zip(_get(metric, PRIVATE.label_names), labels, strict=True))
            for suffix, extra in _suffixes(metric, child):
                family.add_sample(family.name + suffix, base | extra, 0.0)
        lines = generate_latest(_One(family)).decode().splitlines(keepends=True)
        return "".join(lines[:2]), [line[: -len("0.0\n")] for line in lines[2:]]


class _Series:
    """One child's kept rendering: its value reader, its lines' prefixes and its lines for the
    values (as bits) they were last rendered with."""

    __slots__ = ("child", "read", "prefixes", "bits", "text")

    def __init__(self, child: Any, read: Callable[[], list[float]], prefixes: list[str]) -> None:
        self.child = child
        self.read = read
        self.prefixes = prefixes
        self.bits = b""  # no values rendered yet (a series always has at least one line)
        self.text = ""


def _collectors(registry: Any) -> list[Any]:
    """The registry's collectors in ``collect()`` order; raises _Unreadable when it cannot be read so."""
    if _get(registry, PRIVATE.registry_target_info):
        raise _Unreadable(PRIVATE.registry_target_info)
    lock, names = _get(registry, PRIVATE.registry_lock), _get(registry, PRIVATE.registry_collectors)
    if not isinstance(names, dict):
        raise _Unreadable(PRIVATE.registry_collectors)
    with lock:
        return list(names)


def _reader(kind: type, child: Any) -> Callable[[], list[float]]:
    """A function giving the child's line values in order; raises _Unreadable if the child is not as expected."""
    if kind is Histogram:
        buckets, total, bounds = (_get(child, name) for name in (PRIVATE.buckets, PRIVATE.sum, PRIVATE.bounds))
        if len(buckets) != len(bounds) or not all(callable(getattr(b, "get", None)) for b in (*buckets, total)):
            raise _Unreadable(PRIVATE.buckets)

        def histogram() -> list[float]:
            out, acc = [], 0.0
            for b in buckets:
                acc += b.get()
                out.append(acc)
            out.append(acc)
            return out + [total.get()] if bounds[0] >= 0 else out

        return histogram
    if PRIVATE.samples_override in vars(child):  # a gauge with set_function reads its function
        raise _Unreadable(PRIVATE.samples_override)
    value = _get(child, PRIVATE.value)
    if not callable(getattr(value, "get", None)):
        raise _Unreadable(PRIVATE.value)
    return lambda: [value.get()]


def _shapes() -> CollectorRegistry:
    """A registry of every shape of series the project exposes: counters, gauges and histograms,
    with and without labels, label values that need escaping, removed and cleared children,
    non-finite values, a histogram without a _sum line, a gauge reading a function."""
    registry = CollectorRegistry()
    Counter("shape_plain", "No labels.", registry=registry).inc(3)
    counter = Counter("shape_events", 'Help with \\ and\n"quotes".', ("world", "outcome"), registry=registry)
    counter.labels('w"1\\\n', "applied").inc(2.5)
    counter.labels("gone", "applied").inc()
    counter.remove("gone", "applied")
    gauge = Gauge("shape_gauge", "Gauge.", ("dependency",), registry=registry)
    for name, value in (("a", -1.5), ("b", float("nan")), ("c", float("inf")), ("d", 1e21), ("e", 7)):
        gauge.labels(name).set(value)
    gauge.remove("e")
    cleared = Gauge("shape_cleared", "Cleared, then set again.", ("k",), registry=registry)
    cleared.labels("old").set(1)
    cleared.clear()
    cleared.labels("new").set(2)
    Gauge("shape_function", "Set from a function.", registry=registry).set_function(lambda: 41.5)
    Gauge("shape_unset", "Never set.", registry=registry)
    latency = Histogram("shape_seconds", "Histogram.", ("world",), buckets=(0.1, 1.0, 10.0), registry=registry)
    for v in (0.05, 0.1, 0.5, 3.0, 50.0, float("inf")):
        latency.labels("w").observe(v)
    latency.labels("empty")
    Histogram("shape_default_seconds", "Default buckets, no labels.", registry=registry).observe(0.3)
    Histogram("shape_negative", "No _sum line.", buckets=(-1.0, 0.0, 1.0), registry=registry).observe(-3)
    return registry


def _library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prometheus-client")
    except PackageNotFoundError:
        return "(version unknown)"
