"""Reading the figures back after a contender ran: commit history, warehouse files, worker metrics.

Everything here reads what any outside observer could: the Nessie history of the contender's
branches (commit time and the exact offsets each commit carries), the files in its warehouse, the
live files of its tables' current snapshots, and a causeway worker's Prometheus text.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyiceberg.exceptions import NoSuchTableError

from sinks.catalog import NessieCatalog
from sinks.committed_offsets import parse_tp
from sinks.committer import PROP_OFFSETS
from sinks.nessie import SyncNessieClient


def quantiles(values: Sequence[float], qs: Iterable[float] = (0.5, 0.95, 0.99)) -> dict[str, float]:
    """Nearest-rank quantiles, ``{"p50": ..., "p95": ..., "p99": ...}``; empty for no values."""
    if not values:
        return {}
    ordered = sorted(values)
    out = {}
    for q in qs:
        rank = max(1, math.ceil(q * len(ordered)))
        out[f"p{round(q * 100):d}"] = round(ordered[rank - 1], 4)
    return out


# --- commit history --------------------------------------------------------------------------------


@dataclass
class Commit:
    hash: str
    branch: str
    time: datetime
    offsets: dict[tuple[str, int], list[tuple[int, int]]]  # inclusive ranges

    @property
    def events(self) -> int:
        return sum(b - a + 1 for ranges in self.offsets.values() for a, b in ranges)


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """``"100-180,182"`` → ``[(100, 180), (182, 182)]``."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        start, _, end = part.partition("-")
        out.append((int(start), int(end or start)))
    return out


@dataclass
class History:
    commits: list[Commit] = field(default_factory=list)

    def visible_at(self) -> dict[tuple[str, int, int], float]:
        """(topic, partition, offset) → epoch seconds of the first commit carrying it."""
        out: dict[tuple[str, int, int], float] = {}
        for c in self.commits:
            t = c.time.timestamp()
            for (topic, part), ranges in c.offsets.items():
                for a, b in ranges:
                    for o in range(a, b + 1):
                        key = (topic, part, o)
                        if key not in out or t < out[key]:
                            out[key] = t
        return out


def read_history(client: SyncNessieClient, branches: Iterable[str], stop_at: set[str], limit: int = 200_000) -> History:
    """Commits of ``branches`` (each once) that carry causeway offset properties, newest first per branch."""
    seen: set[str] = set()
    hist = History()
    for branch in branches:
        n = 0
        try:
            entries = client.history_entries(branch, max_records=500)
            for entry in entries:
                if entry.hash in stop_at or entry.hash in seen or n >= limit:
                    break
                n += 1
                seen.add(entry.hash)
                offsets = {
                    parse_tp(k[len(PROP_OFFSETS) :]): parse_ranges(v)
                    for k, v in entry.properties.items()
                    if k.startswith(PROP_OFFSETS)
                }
                if offsets:
                    hist.commits.append(Commit(entry.hash, branch, entry.commit_time, offsets))
        except Exception as exc:  # noqa: BLE001 - a branch the contender never created has no history
            if "not found" not in str(exc).lower() and "NotFound" not in type(exc).__name__:
                raise
    hist.commits.sort(key=lambda c: c.time)
    return hist


# --- warehouse -------------------------------------------------------------------------------------


@dataclass
class WarehouseSizes:
    data_bytes: int = 0  # every Parquet file ever written (data and delete files)
    data_files: int = 0
    metadata_bytes: int = 0  # every metadata JSON, manifest list and manifest ever written
    metadata_files: int = 0
    current_metadata_json_bytes: int = 0  # the newest metadata JSON of each table directory


def warehouse_path(warehouse: str) -> Path:
    return Path(urlparse(warehouse).path) if warehouse.startswith("file://") else Path(warehouse)


def warehouse_sizes(root: Path) -> WarehouseSizes:
    out = WarehouseSizes()
    newest: dict[str, tuple[float, int]] = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            if name.endswith(".parquet"):
                out.data_bytes += st.st_size
                out.data_files += 1
            elif name.endswith((".metadata.json", ".avro")):
                out.metadata_bytes += st.st_size
                out.metadata_files += 1
                if name.endswith(".metadata.json"):
                    prev = newest.get(dirpath)
                    if prev is None or st.st_mtime >= prev[0]:
                        newest[dirpath] = (st.st_mtime, st.st_size)
    out.current_metadata_json_bytes = sum(size for _, size in newest.values())
    return out


def live_bytes(catalog: NessieCatalog, branches: Iterable[str], namespace: str, tables: Iterable[str]) -> int:
    """Bytes of the data and delete files the branches' current snapshots reference (each file once)."""
    seen: dict[str, int] = {}
    for branch in branches:
        cat = catalog.at(branch)
        for name in tables:
            try:
                table = cat.load_table((namespace, name))
            except NoSuchTableError:
                continue
            except Exception as exc:  # noqa: BLE001 - a missing branch holds nothing
                if "not found" in str(exc).lower() or "NotFound" in type(exc).__name__:
                    continue
                raise
            for task in table.scan().plan_files():
                seen[task.file.file_path] = task.file.file_size_in_bytes
                for d in task.delete_files:
                    seen[d.file_path] = d.file_size_in_bytes
    return sum(seen.values())


# --- Prometheus text ---------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


@dataclass
class HistogramSample:
    """A histogram summed over workers: cumulative bucket counts by upper bound, sum and count."""

    buckets: dict[float, float] = field(default_factory=dict)
    total: float = 0.0
    count: float = 0.0

    def __sub__(self, earlier: HistogramSample) -> HistogramSample:
        """What was observed between ``earlier`` and this sample (a phase of a run)."""
        return HistogramSample(
            {b: v - earlier.buckets.get(b, 0.0) for b, v in self.buckets.items()},
            self.total - earlier.total,
            self.count - earlier.count,
        )


def histogram_sample(texts: Iterable[str], name: str) -> HistogramSample:
    """Sum several workers' histogram ``name`` (every label set)."""
    out = HistogramSample()
    for text in texts:
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if not m:
                continue
            n, labels, value = m.group("name"), m.group("labels") or "", float(m.group("value"))
            if n == f"{name}_sum":
                out.total += value
            elif n == f"{name}_count":
                out.count += value
            elif n == f"{name}_bucket":
                le = re.search(r'le="([^"]+)"', labels)
                if le:
                    bound = math.inf if le.group(1) == "+Inf" else float(le.group(1))
                    out.buckets[bound] = out.buckets.get(bound, 0.0) + value
    return out


def histogram(texts: Iterable[str], name: str) -> dict[str, float]:
    """Sum several workers' histogram ``name``: count, mean and bucket-interpolated quantiles."""
    return summarize(histogram_sample(texts, name))


def summarize(sample: HistogramSample) -> dict[str, float]:
    """Count, mean and bucket-interpolated p50 / p95 / p99 of a histogram sample."""
    count = sample.count
    if not count:
        return {}
    out = {"count": int(count), "mean": round(sample.total / count, 4)}
    ordered = sorted(sample.buckets.items())
    for q in (0.5, 0.95, 0.99):
        target = q * count
        prev_bound, prev_cum = 0.0, 0.0
        for bound, cum in ordered:
            if cum >= target:
                if math.isinf(bound):
                    value = prev_bound
                else:
                    share = (target - prev_cum) / (cum - prev_cum) if cum > prev_cum else 1.0
                    value = prev_bound + (bound - prev_bound) * share
                out[f"p{round(q * 100):d}"] = round(value, 4)
                break
            prev_bound, prev_cum = bound, cum
    return out


def counter(texts: Iterable[str], name: str, label_filter: str = "") -> float:
    total = 0.0
    for text in texts:
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if m and m.group("name") == name and label_filter in (m.group("labels") or ""):
                total += float(m.group("value"))
    return total


# --- series ------------------------------------------------------------------------------------------


def thin(series: Sequence[Any], points: int) -> list[Any]:
    """At most ``points`` entries of ``series``, evenly spaced, the first and the last always kept
    (a memory curve over a long drain is read for its shape, not every 0.2 s poll)."""
    if len(series) <= points:
        return list(series)
    if points < 2:
        return list(series[-points:]) if points == 1 else []
    step = (len(series) - 1) / (points - 1)
    return [series[round(i * step)] for i in range(points)]
