"""Measure the log's layout: files an entity's audit trail and a one-day window read, and compaction cost.

    python -m bench.layout --events 200000 --days 5 --flush 5000 --target-bytes 4194304

Writes ``--events`` object events (random keys among ``--keys``, ``occurred_at`` spread over
``--days`` days) through the real committer in flushes of ``--flush``, on a fresh branch and a
temporary warehouse, then plans scans of ``entity_events``: the audit trail of a few entities and
a one-day window. Prints the data files each scan plans against the table's files, and the rows
compaction rewrote against the rows written (write amplification of the log).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid

from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.committer import Batch, BatchCommitter, Source
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings

TOPIC = "onto.changes.objects"
DAY_MS = 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--days", type=int, default=5)
    ap.add_argument("--flush", type=int, default=5_000)
    ap.add_argument("--target-bytes", type=int, default=64 * 1024 * 1024, help="CAUSEWAY_TARGET_FILE_BYTES")
    args = ap.parse_args(argv)

    warehouse = f"file://{tempfile.mkdtemp(prefix='causeway-layout-')}"
    settings = Settings.from_env(warehouse=warehouse, target_file_bytes=args.target_bytes)
    client = SyncNessieClient.from_settings(settings)
    world = f"layout{uuid.uuid4().hex[:8]}"
    branch = f"world-{world}"
    client.create_branch(branch, Reference("main", "BRANCH", client.config().no_ancestor_hash))
    committer = BatchCommitter(settings, client)
    print(f"branch {branch}, warehouse {warehouse}", flush=True)

    versions: dict[int, int] = {}
    written = rewritten = 0
    latencies: list[float] = []
    per_day = args.events // args.days
    for n, start in enumerate(range(0, args.events, args.flush)):
        items = []
        for i in range(start, min(args.events, start + args.flush)):
            pk = random.randrange(args.keys)
            versions[pk] = versions.get(pk, 0) + 1
            ev = ChangeEvent(
                event_id=f"{world}-{i}",
                world_id=world,
                kind=EntityKind.OBJECT,
                entity_type="widget",
                entity_pk=f"pk-{pk:09d}",
                change_type=ChangeType.CREATE if versions[pk] == 1 else ChangeType.UPDATE,
                version=versions[pk],
                before=None,
                after={"n": i, "tag": "x" * 40},
                caused_by=None,
                causal_order=None,
                occurred_at_ms=T0 + (i // per_day) * DAY_MS + i % per_day,
                schema_version=0,
                source="bench",
            )
            items.append((ev, Source(TOPIC, 0, i)))
        t = time.monotonic()
        out = committer.commit_batch(Batch.from_sources(world, f"b{n}", items))
        latencies.append(time.monotonic() - t)
        st = out.stats["entity_events"]
        written += st.rows_written
        rewritten += st.rows_rewritten
    log = committer.catalog(branch).load_table((settings.namespace, "entity_events"))
    files = list(log.scan().plan_files())
    trail_counts = []
    for pk in random.sample(sorted(versions), 5):
        expr = And(EqualTo("entity_type", "widget"), EqualTo("entity_pk", f"pk-{pk:09d}"))  # type: ignore[call-arg, arg-type]
        trail_counts.append(len(list(log.scan(row_filter=expr).plan_files())))
    day = 1
    lo, hi = T0 + day * DAY_MS, T0 + (day + 1) * DAY_MS
    window = And(GreaterThanOrEqual("occurred_at", lo * 1000), LessThan("occurred_at", hi * 1000))  # type: ignore[call-arg, arg-type]
    window_files = len(list(log.scan(row_filter=window).plan_files()))
    print(
        f"events={args.events} keys={args.keys} days={args.days} flush={args.flush} target={args.target_bytes}: "
        f"{len(files)} data files; audit trail plans {statistics.mean(trail_counts):.1f} (max {max(trail_counts)}); "
        f"one-day window plans {window_files}; log rows written {written}, rewritten by compaction {rewritten} "
        f"({rewritten / max(1, written):.2f}x); flush p50 {statistics.median(latencies):.2f}s "
        f"max {max(latencies):.2f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
