"""Measure the tables' layouts: the files a read opens, and compaction cost.

    python -m bench.layout --events 200000 --days 5 --flush 5000 --target-bytes 4194304
    python -m bench.layout --projection-buckets 0,2,4 --keys 300000

The log (the first form):
Writes ``--events`` object events (random keys among ``--keys``, ``occurred_at`` spread over
``--days`` days) through the real committer in flushes of ``--flush``, on a fresh branch and a
temporary warehouse, then plans scans of ``entity_events``: the audit trail of a few entities and
a one-day window. Prints the data files each scan plans against the table's files, and the rows
compaction rewrote against the rows written (write amplification of the log).

The projections (``--projection-buckets``, one world per bucket count, ``Settings.projection_buckets``):
seeds ``--keys`` objects of the keys axis's three types (``bench.keys_seeded``) in commits of
``--seed-batch``, then ``--flushes`` flushes of ``--flush`` random updates, so each partition holds
seed files, flush files and position deletes as a worker leaves them; then counts what two reads
open in ``entity_common``: an entity's point lookup (``worlds.api``'s scan, type = T and pk = P:
data files planned, delete files applied, their bytes, CPU of the scan) and a flush's key lookup
(a commit of k random updates: data files its partition pruning keeps, data files its key filters
let it read, delete files, bytes read from storage, CPU of the commit), with a warm committer (key
filters and index from the flushes before) and a cold one (a worker just started). The entity's
audit trail reads the log, whose layout does not depend on the bucket count.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

import sinks.projection_write
from bench.keys_seeded import TYPES, keyed_event
from bench.scratch import drop_world, scratch_world
from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.committer import Batch, BatchCommitter, Source
from sinks.nessie import Reference, SyncNessieClient
from sinks.tables import ENTITY_COMMON
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
    ap.add_argument(
        "--projection-buckets",
        default=None,
        help="comma-separated bucket counts: measure the projections' reads instead of the log's",
    )
    ap.add_argument("--seed-batch", type=int, default=100_000, help="objects per seeding commit (projections)")
    ap.add_argument("--flushes", type=int, default=10, help="flushes of random updates before measuring")
    ap.add_argument("--lookups", type=int, default=20, help="entities looked up (projections)")
    ap.add_argument("--batch-keys", default="1,10,100,1000", help="keys of the measured flushes (projections)")
    args = ap.parse_args(argv)
    if args.projection_buckets is not None:
        for n in (int(b) for b in args.projection_buckets.split(",")):
            projection_reads(n, args)
        return 0

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


@contextlib.contextmanager
def lookups_recorded() -> Iterator[list[dict[str, Any]]]:
    """Every key lookup of ``entity_common`` a flush makes while inside (``read_state`` with the key
    index's columns): data files kept by partition, data files read, delete files, bytes read."""
    inner = sinks.projection_write.read_state
    seen: list[dict[str, Any]] = []

    def read_state(table, columns, match, cache, scan=None):
        state = inner(table, columns, match, cache, scan)
        if table.name()[-1] == ENTITY_COMMON and "deleted" in columns:
            seen.append(
                {
                    "kept": len(state.files),
                    "read": state.files_read,
                    "deletes": len(state.delete_files),
                    "bytes": state.bytes_read,
                }
            )
        return state

    sinks.projection_write.read_state = read_state  # type: ignore[assignment]
    try:
        yield seen
    finally:
        sinks.projection_write.read_state = inner


def projection_reads(buckets: int, args: argparse.Namespace) -> None:
    settings = Settings.from_env().replace(projection_buckets=buckets)
    settings, client, world, committer = scratch_world("prj", settings)
    rng = random.Random(11)
    seq = args.keys + 1_000
    versions: dict[int, int] = {}

    def updates(k: int) -> list[tuple[ChangeEvent, Source]]:
        nonlocal seq
        items = []
        for _ in range(k):
            n = rng.randrange(args.keys)
            versions[n] = versions.get(n, 1) + 1
            items.append((keyed_event(world, n, versions[n], seq, "upd"), Source(TOPIC, 0, seq)))
            seq += 1
        return items

    try:
        for first in range(0, args.keys, args.seed_batch):
            items = [
                (keyed_event(world, n, 1, n, "seed"), Source("seed", 0, n))
                for n in range(first, min(args.keys, first + args.seed_batch))
            ]
            committer.commit_batch(Batch.from_sources(world, f"seed-{first}", items))
        for i in range(args.flushes):
            committer.commit_batch(Batch.from_sources(world, f"warm-{i}", updates(args.flush)))
        table = committer.catalog(f"world-{world}").load_table((settings.namespace, ENTITY_COMMON))
        tasks = list(table.scan().plan_files())
        total_deletes = len({d.file_path for t in tasks for d in t.delete_files})
        print(
            f"buckets={buckets} keys={args.keys} seed_batch={args.seed_batch} flushes={args.flushes}x{args.flush}: "
            f"entity_common {len(tasks)} data files ({sum(t.file.file_size_in_bytes for t in tasks)} bytes), "
            f"{total_deletes} delete files",
            flush=True,
        )
        planned, applied, nbytes, cpu = [], [], [], []
        for n in rng.sample(range(args.keys), args.lookups):
            expr = And(EqualTo("object_type_id", TYPES[n % len(TYPES)]), EqualTo("object_pk", f"obj-{n}"))  # type: ignore[call-arg, arg-type]
            t0 = time.process_time()
            scan = table.scan(row_filter=expr)
            found = list(scan.plan_files())
            rows = scan.to_arrow().num_rows
            cpu.append(time.process_time() - t0)
            assert rows == 1, f"obj-{n}: {rows} rows"
            planned.append(len(found))
            applied.append(len({d.file_path for t in found for d in t.delete_files}))
            nbytes.append(sum(t.file.file_size_in_bytes for t in found))
        print(
            f"  point lookup ({args.lookups} entities): data files {statistics.mean(planned):.1f} "
            f"(max {max(planned)}), delete files {statistics.mean(applied):.1f}, "
            f"bytes {statistics.mean(nbytes):.0f}, cpu {statistics.median(cpu) * 1000:.0f} ms (median)",
            flush=True,
        )
        for k in (int(x) for x in args.batch_keys.split(",")):
            for state in ("warm", "cold"):
                c = committer if state == "warm" else BatchCommitter(settings, client)
                with lookups_recorded() as seen:
                    t0 = time.process_time()
                    c.commit_batch(Batch.from_sources(world, f"k{k}-{state}", updates(k)))
                    spent = time.process_time() - t0
                look = seen[-1]
                print(
                    f"  flush of {k} keys ({state}): data files kept {look['kept']}, read {look['read']}, "
                    f"delete files {look['deletes']}, bytes read {look['bytes']}, commit cpu {spent:.2f} s",
                    flush=True,
                )
    finally:
        drop_world(client, world)


if __name__ == "__main__":
    sys.exit(main())
