"""Wall and CPU time of each stage of a batch commit, by wrapping the functions that do them.

Used by ``python -m bench.commit_cpu --stages``. Stages nest (a projection's ``key lookup`` contains
its ``plan files``); each is timed inclusively, wall (``perf_counter``) and process CPU
(``process_time``, so work in pyiceberg's pool threads counts for the stage that waits on it).
Only for a process that commits one batch at a time.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: (label, module, attribute path): what each stage is, and the callable that does it.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("nessie: begin (head)", "sinks.catalog", "NessieCatalog.begin"),
    ("nessie: contents", "sinks.catalog", "NessieCatalog.prefetch"),
    ("metadata JSON read", "sinks.catalog", "NessieCatalog._metadata_at"),
    ("committed-offset map parse", "sinks.committer", "loads_map"),
    ("projection (all of it)", "sinks.committer", "apply_projection"),
    ("  key lookup (plan + read)", "sinks.projection_write", "read_state"),
    ("  carry stored properties", "sinks.projection_write", "carry_stored_properties"),
    ("  Arrow rows (projection)", "sinks.projection_write", "projection_arrow"),
    ("  compaction pick + read", "sinks.compaction", "Compaction.rewrites"),
    ("  partition split (write plan)", "sinks.projection_write", "_write_batches"),
    ("  Parquet data files", "sinks.projection_write", "write_split"),  # rows split by _write_batches
    ("  Parquet data files", "sinks.projection_write", "write_data_files_with_rows"),  # before 2026-12-02
    ("  Parquet data files", "sinks.projection_write", "write_data_files"),  # before the rows were kept
    ("  Parquet delete files", "sinks.projection_write", "write_partition_deletes"),
    ("plan files (pyiceberg)", "pyiceberg.table", "DataScan.plan_files"),
    ("manifests: RowDelta", "sinks.rowdelta", "RowDelta._manifests"),
    ("snapshot commit (manifests + list)", "pyiceberg.table.update.snapshot", "_SnapshotProducer._commit"),
    ("snapshot commit (manifests + list)", "sinks.rowdelta", "RowDelta._commit_v2"),  # its own since 2026-12-01
    ("  Avro blocks of manifests and lists", "sinks.manifest_write", "_OneBlockAvroFile._write_pending"),
    ("events log (all of it)", "sinks.committer", "BatchCommitter._append_events"),
    ("  Arrow rows (events)", "sinks.committer", "events_arrow"),
    ("  append (Parquet + manifest)", "pyiceberg.table", "Transaction.append"),  # before 2026-12-01
    ("  Parquet data files (log)", "sinks.committer", "write_data_files_with_rows"),  # the append through RowDelta
    ("  log compaction", "sinks.committer", "compact_log"),
    ("snapshot expiry", "sinks.compaction", "Compaction.expire"),
    ("metadata update (pyiceberg, deep copies)", "pyiceberg.table", "update_table_metadata"),
    ("metadata update (pyiceberg, deep copies)", "pyiceberg.catalog", "update_table_metadata"),
    ("metadata update (build, no deep copy)", "sinks.table_metadata", "build"),
    ("metadata JSON write", "pyiceberg.catalog", "MetastoreCatalog._write_metadata"),
    ("metadata JSON write", "sinks.catalog", "NessieCatalog._write_metadata"),
    ("nessie: publish", "sinks.catalog", "NessieCatalog.publish"),
    ("nessie: HTTP round trips (all)", "httpx", "Client.send"),
    ("nessie: HTTP round trips (all)", "sinks.nessie_http", "KeptConnections.request"),  # the sync client's, 2026-12-02
    ("manifest entries read (thread CPU, all threads)", "pyiceberg.manifest", "ManifestFile.fetch_manifest_entry"),
)

#: Stages that run in pyiceberg's pool threads: timed with the thread's own CPU clock.
IN_THREADS = frozenset({"manifest entries read (thread CPU, all threads)"})

#: (module, function): every way a commit creates a file, by the name each writer calls it under.
FILE_WRITERS: tuple[tuple[str, str], ...] = (
    ("sinks.fileio", "write_file"),  # manifests and manifest lists (``SizedOutputFile``)
    ("sinks.catalog", "write_file"),  # metadata JSON
    ("sinks.datafiles", "write_file"),  # small data files
    ("sinks.datafiles", "open_output"),  # large data files
    ("sinks.rowdelta", "open_output"),  # position-delete files
    ("sinks.rowdelta", "write_file"),  # position-delete files, when written in one go
)

TABLES = ("entity_events", "entity_common", "entity_edge")


def file_kind(location: str) -> tuple[str, str]:
    """(table, kind) of a file a commit writes, from its location (pyiceberg's and causeway's names). Pure.

    Kinds: ``data``, ``delete`` (position deletes), ``manifest``, ``manifest list``, ``metadata``.
    """
    table = next((t for t in TABLES if f"/{t}" in location), "other")
    name = location.rsplit("/", 1)[-1]
    if name.endswith(".metadata.json"):
        kind = "metadata"
    elif name.startswith("snap-") and name.endswith(".avro"):
        kind = "manifest list"
    elif name.endswith(".avro"):
        kind = "manifest"
    elif name.startswith("delete-"):
        kind = "delete"
    else:
        kind = "data"
    return table, kind


class StageTimer:
    """Accumulates (wall, cpu, calls) per stage while installed."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._local = threading.local()
        self._lock = threading.Lock()
        #: Files created while installed, by (table, kind) (:func:`file_kind`).
        self.files: dict[tuple[str, str], int] = defaultdict(int)

    def _wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.thread_time if label in IN_THREADS else time.process_time

        def timed(*a: Any, **kw: Any) -> Any:
            depth: dict[str, int] = self._local.__dict__.setdefault("depth", defaultdict(int))
            outer = depth[label] == 0  # recursion, and a stage wrapped at two places, count once
            depth[label] += 1
            w, c = time.perf_counter(), clock()
            try:
                return fn(*a, **kw)
            finally:
                depth[label] -= 1
                if outer:
                    with self._lock:
                        self.wall[label] += time.perf_counter() - w
                        self.cpu[label] += clock() - c
                        self.calls[label] += 1

        return timed

    def _counting(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(io: Any, location: str, *a: Any, **kw: Any) -> Any:
            with self._lock:
                self.files[file_kind(location)] += 1
            return fn(io, location, *a, **kw)

        return counted

    @contextmanager
    def installed(self) -> Iterator[StageTimer]:
        import importlib

        undo: list[tuple[object, str, object]] = []
        for label, module, path in STAGES:
            owner: Any = importlib.import_module(module)
            *parents, name = path.split(".")
            for p in parents:
                owner = getattr(owner, p)
            original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
            if original is None:
                continue  # not in this version of the code (the table shows what was found)
            fn = original.__func__ if isinstance(original, staticmethod) else original
            wrapped = self._wrap(label, fn)
            setattr(owner, name, staticmethod(wrapped) if isinstance(original, staticmethod) else wrapped)
            undo.append((owner, name, original))
        # Every writer module imported before any is patched: one imported later would bind the
        # patched function by name and count each of its files twice.
        owners = [(importlib.import_module(module), name) for module, name in FILE_WRITERS]
        for owner, name in owners:
            original = getattr(owner, name, None)
            if original is not None:
                setattr(owner, name, self._counting(original))
                undo.append((owner, name, original))
        try:
            yield self
        finally:
            for owner, name, original in reversed(undo):
                setattr(owner, name, original)

    def reset(self) -> None:
        self.wall.clear()
        self.cpu.clear()
        self.calls.clear()
        self.files.clear()

    def table(self, commits: int, total_wall: float, total_cpu: float) -> str:
        """Markdown: ms per commit per stage (inclusive; indented stages are inside the one above)."""
        lines = ["| stage | wall ms / commit | CPU ms / commit | calls / commit |", "| --- | --- | --- | --- |"]
        for label in dict.fromkeys(label for label, _, _ in STAGES):
            if self.calls.get(label):
                lines.append(
                    f"| {label} | {1000 * self.wall[label] / commits:.1f} | {1000 * self.cpu[label] / commits:.1f} "
                    f"| {self.calls[label] / commits:.1f} |"
                )
        lines.append(f"| **whole commit** | {1000 * total_wall / commits:.1f} | {1000 * total_cpu / commits:.1f} | 1 |")
        return "\n".join(lines) + "\n\n" + self.files_table(commits)

    def files_table(self, commits: int) -> str:
        """Markdown: files created per commit, by table and kind."""
        kinds = ("data", "delete", "manifest", "manifest list", "metadata")
        lines = ["| files per commit | " + " | ".join(kinds) + " | all |", "| --- |" + " --- |" * (len(kinds) + 1)]
        for table in (*TABLES, "other"):
            counts = [self.files.get((table, k), 0) / commits for k in kinds]
            if any(counts):
                lines.append(f"| {table} | " + " | ".join(f"{c:.2f}" for c in counts) + f" | {sum(counts):.2f} |")
        total = sum(self.files.values()) / commits
        lines.append(
            "| **all tables** | "
            + " | ".join(f"{sum(self.files.get((t, k), 0) for t in (*TABLES, 'other')) / commits:.2f}" for k in kinds)
            + f" | {total:.2f} |"
        )
        return "\n".join(lines)
