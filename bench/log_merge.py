"""Memory and CPU of the event log's compaction alone, against the running Nessie (a quick measure).

Appends ``--flushes`` flush files of ``--events`` fresh keys (one day) to the log of a scratch
world the way a commit does (its rows written, kept in the committer's ``FileCache``, then
``compact_log`` in the same transaction), without the projections, so every merge tier is
reached in a minute. For each ``compact_log`` call it records the process CPU
(``time.process_time``: the box is shared), the rows rewritten and Arrow's allocated bytes above
the level at the call's start (sampled every millisecond by a thread: Arrow's kernels release the
GIL); at the end, Arrow's lifetime peak (``max_memory``) and the process's peak RSS (``VmHWM``).
The largest transient a commit makes is what the allocator keeps (docs/architecture.md, "The
worker's memory bound")::

    python -m bench.log_merge --flushes 80 --events 5000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from bench.scratch import drop_world, scratch_event, scratch_world
from models.events import EntityKind
from sinks import committer as committer_module
from sinks.committer import Batch, Source
from sinks.flush_stats import FlushStats
from sinks.rowdelta import RowDelta, write_data_files_with_rows
from sinks.rows import events_arrow
from sinks.tables import arrow_schema
from streams.settings import Settings

MIB = 2**20


class ArrowPeak:
    """Arrow's allocated bytes, sampled by a thread; ``peak_since(mark)`` is the high above ``mark``."""

    def __init__(self) -> None:
        self._high = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ArrowPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._high = max(self._high, pa.total_allocated_bytes())
            time.sleep(0.001)

    def reset(self) -> int:
        self._high = now = pa.total_allocated_bytes()
        return now

    @property
    def high(self) -> int:
        return max(self._high, pa.total_allocated_bytes())


def _vm_hwm_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flushes", type=int, default=80)
    ap.add_argument("--events", type=int, default=5000, help="fresh keys per flush file")
    ap.add_argument("--out", help="write the per-call records and totals here (JSON)")
    args = ap.parse_args()

    settings, client, world, committer = scratch_world("logmerge", Settings.from_env())
    rng = random.Random(13)
    calls: list[dict[str, Any]] = []
    real_compact = committer_module.compact_log
    peak = ArrowPeak()

    def measured(tx: Any, *a: Any, **kw: Any) -> int:
        stats = a[1] if len(a) > 1 else kw.get("stats")
        before = stats.rows_rewritten if stats is not None else 0
        mark = peak.reset()
        t0 = time.process_time()
        removed = real_compact(tx, *a, **kw)
        calls.append(
            {
                "cpu_s": time.process_time() - t0,
                "files_removed": removed,
                "rows_rewritten": (stats.rows_rewritten - before) if stats is not None else 0,
                "arrow_above_start_mib": (peak.high - mark) / MIB,
            }
        )
        return removed

    groups: list[int] = []  # rows of the files each merge removed (RowDelta.remove: one call per merge)
    real_remove = RowDelta.remove

    def removing(self: RowDelta, files: Any) -> RowDelta:
        files = list(files)
        if any("entity_events" in f.file_path for f in files):
            groups.append(sum(f.record_count for f in files))
        return real_remove(self, files)

    RowDelta.remove = removing  # type: ignore[method-assign]
    try:
        # One commit creates the world's tables; from then on only the log is written.
        seed = [(scratch_event(world, EntityKind.OBJECT, "seed", 1, 0), Source("onto.changes.objects", 0, 0))]
        committer.commit_batch(Batch.from_sources(world, "seed", seed))
        table = committer.catalog(f"world-{world}").load_table((settings.namespace, "entity_events"))
        committer_module.compact_log = measured
        t_all = time.process_time()
        with peak:
            for i in range(args.flushes):
                items = [
                    (
                        scratch_event(world, EntityKind.OBJECT, f"k{rng.getrandbits(48):012x}", 1, n),
                        Source("onto.changes.objects", 0, 1 + i * args.events + n),
                    )
                    for n in range(args.events)
                ]
                table = _append(committer, table, items, f"b{i}", settings, measured)
        total_cpu = time.process_time() - t_all
    finally:
        committer_module.compact_log = real_compact
        RowDelta.remove = real_remove  # type: ignore[method-assign]
        drop_world(client, world)
    merges = [c for c in calls if c["files_removed"]]
    doc = {
        "tree_has_bound": hasattr(settings, "log_merge_max_rows"),
        "load": [round(x, 2) for x in os.getloadavg()],
        "flushes": args.flushes,
        "events": args.events,
        "compactions": len(merges),  # compact_log calls that merged
        "compaction_cpu_s": round(sum(c["cpu_s"] for c in calls), 3),
        "run_cpu_s": round(total_cpu, 3),
        "rows_rewritten": sum(c["rows_rewritten"] for c in calls),
        "merges": len(groups),
        "largest_merge_rows": max(groups, default=0),
        "largest_compaction_arrow_mib": round(max((c["arrow_above_start_mib"] for c in merges), default=0.0), 1),
        "arrow_max_memory_mib": round(pa.default_memory_pool().max_memory() / MIB, 1),
        "vm_hwm_mib": round(_vm_hwm_mib(), 1),
    }
    print(json.dumps(doc))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**doc, "calls": calls}, f, indent=1)


def _append(committer: Any, table: Any, items: list[Any], batch_id: str, settings: Settings, compact: Any) -> Any:
    """A flush's log half, as ``BatchCommitter._append_events`` does it; returns the table after it."""
    tx = table.transaction()
    arrow = events_arrow(items, batch_id, datetime.now(UTC), set(), arrow_schema(table.schema()))
    written = write_data_files_with_rows(tx.table_metadata, arrow, table.io)
    RowDelta(tx).add(f for f, _ in written).commit()
    for f, rows in written:
        if f.file_size_in_bytes < settings.target_file_bytes // 4:
            committer.file_cache.seed_rows(f.file_path, rows)
    kwargs: dict[str, Any] = {"row_bytes": arrow.nbytes / arrow.num_rows, "cache": committer.file_cache}
    if hasattr(settings, "log_merge_max_rows"):  # the bound, where the tree has one
        kwargs["max_rows"] = settings.log_merge_max_rows
    compact(tx, settings.target_file_bytes, FlushStats(), **kwargs)
    return tx.commit_transaction()


if __name__ == "__main__":
    main()
