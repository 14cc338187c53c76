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

The values are read from prometheus_client's metric children (``_metrics``, ``_value``,
``_buckets``, ``_sum``, ``_upper_bounds``), as ``monitoring.metrics.observe_many`` writes them:
the library has no public per-child reader. Anything that is not a plain Counter, Gauge or
Histogram as of prometheus_client 0.26 (another collector, ``_created`` series switched on, a
gauge with ``set_function``, a registry with target info, internals moved) is rendered by
``generate_latest`` itself, so the page is never wrong, only slower
(``tests/unit/test_monitoring_exposition.py`` compares the two byte for byte).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import prometheus_client.metrics as client_metrics
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

#: Kept line prefixes above this many are dropped (and rebuilt as scraped): label values are
#: bounded by design (monitoring.metrics), this only bounds a registry that is not.
MAX_PREFIXES = 200_000


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
        bounds = child._upper_bounds
        out = [("_bucket", {"le": floatToGoString(b)}) for b in bounds] + [("_count", {})]
        return out + [("_sum", {})] if bounds[0] >= 0 else out
    return [("_total" if isinstance(metric, Counter) else "", {})]


class Exposition:
    """Renders a registry in the text format; keeps each series' line prefix between scrapes."""

    def __init__(self) -> None:
        # By the metric's id, holding the metric itself: an id is not reused while its entries live.
        self._heads: dict[int, tuple[Any, str]] = {}
        self._prefixes: dict[tuple[int, tuple[str, ...]], list[str]] = {}

    def render(self, registry: CollectorRegistry) -> bytes:
        """The page ``generate_latest(registry)`` would serve now."""
        collectors = self._collectors(registry)
        if collectors is None:
            return generate_latest(registry)
        out: list[str] = []
        for collector in collectors:
            if not self._render_fast(collector, out):
                out.append(generate_latest(_Families(collector)).decode())
        return "".join(out).encode()

    @staticmethod
    def _collectors(registry: CollectorRegistry) -> list[Any] | None:
        """The registry's collectors in ``collect()`` order; None when it cannot be read this way."""
        if getattr(registry, "_target_info", None):
            return None
        lock = getattr(registry, "_lock", None)
        names = getattr(registry, "_collector_to_names", None)
        if lock is None or not isinstance(names, dict):
            return None
        with lock:
            return list(names)

    def _render_fast(self, metric: Any, out: list[str]) -> bool:
        """Append ``metric``'s lines to ``out``; False (nothing appended) if it is not readable here."""
        kind = type(metric)
        if kind not in (Counter, Gauge, Histogram) or getattr(client_metrics, "_use_created", True):
            return False
        if metric._is_parent():
            lock, children = getattr(metric, "_lock", None), getattr(metric, "_metrics", None)
            if lock is None or not isinstance(children, dict):
                return False
            with lock:
                series = list(children.items())
        else:
            series = [((), metric)]
        values = []
        for labels, child in series:
            read = _reader(kind, child)
            if read is None:
                return False
            values.append((labels, child, read))
        key = id(metric)
        kept = self._heads.get(key)
        if kept is None:
            kept = self._heads[key] = (metric, self._line_texts(metric, [])[0])
        out.append(kept[1])
        for labels, child, read in values:
            prefixes = self._prefixes.get((key, labels))
            if prefixes is None:
                if len(self._prefixes) >= MAX_PREFIXES:
                    self._prefixes.clear()
                prefixes = self._prefixes[(key, labels)] = self._line_texts(metric, [(labels, child)])[1]
            out += [p + floatToGoString(v) + "\n" for p, v in zip(prefixes, read(), strict=True)]
        return True

    @staticmethod
    def _line_texts(metric: Any, series: list[tuple[tuple[str, ...], Any]]) -> tuple[str, list[str]]:
        """The HELP/TYPE lines of ``metric`` and its lines' prefixes (up to the value) for ``series``,
        rendered by ``generate_latest`` on a family holding those lines at value 0."""
        family = Metric(metric._name, metric._documentation, metric._type)
        for labels, child in series:
            base = dict(zip(metric._labelnames, labels, strict=True))
            for suffix, extra in _suffixes(metric, child):
                family.add_sample(metric._name + suffix, base | extra, 0.0)
        lines = generate_latest(_One(family)).decode().splitlines(keepends=True)
        return "".join(lines[:2]), [line[: -len("0.0\n")] for line in lines[2:]]


def _reader(kind: type, child: Any) -> Any:
    """A function giving the child's line values in order, or None if the child is not as expected."""
    if kind is Histogram:
        buckets, total, bounds = (getattr(child, a, None) for a in ("_buckets", "_sum", "_upper_bounds"))
        if buckets is None or total is None or bounds is None or len(buckets) != len(bounds):
            return None

        def histogram() -> list[float]:
            out, acc = [], 0.0
            for b in buckets:
                acc += b.get()
                out.append(acc)
            out.append(acc)
            return out + [total.get()] if bounds[0] >= 0 else out

        return histogram
    value = getattr(child, "_value", None)
    if value is None or "_child_samples" in vars(child):  # a gauge with set_function reads its function
        return None
    return lambda: [value.get()]
