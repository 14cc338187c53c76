"""Benchmark the sink: a world with N objects, then 10k-event flushes of random updates.

    python -m bench.sink_flush --rows 1000000 --flush 10000 --flushes 20

Prints the commit latency (p50 / p99) of the flushes and, per flush, the rows and bytes written,
deleted and *rewritten* (stored rows copied again by compaction) in ``entity_common``, plus the
bytes read to decide. Runs against the Nessie of ``CAUSEWAY_NESSIE_URL`` on a fresh branch and a
warehouse under a temporary directory (or ``--warehouse``).
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid

import pyarrow.compute as pc

from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.committer import Batch, BatchCommitter, Source
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings

TOPIC = "onto.changes.objects"


def _event(world: str, pk: int, version: int, change: ChangeType, seq: int) -> ChangeEvent:
    props = {"name": f"object {pk}", "score": random.random(), "version": version, "tag": "x" * 40}
    return ChangeEvent(
        event_id=f"{world}-{seq}",
        world_id=world,
        kind=EntityKind.OBJECT,
        entity_type="widget" if pk % 2 else "gadget",
        entity_pk=f"pk-{pk:09d}",
        change_type=change,
        version=version,
        before=None,
        after=props,
        caused_by=None,
        causal_order=None,
        occurred_at_ms=int(time.time() * 1000),
        schema_version=0,
        source="bench",
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="objects in the world before timing")
    ap.add_argument("--flush", type=int, default=10_000, help="events per timed flush")
    ap.add_argument("--flushes", type=int, default=20, help="timed flushes")
    ap.add_argument("--seed-batch", type=int, default=100_000, help="events per flush while seeding")
    ap.add_argument("--max-small-files", type=int, default=16, help="committer's small-file bin-packing fanout")
    ap.add_argument("--warehouse", default="", help="file:///path or s3://bucket (default: a temp dir)")
    args = ap.parse_args(argv)

    warehouse = args.warehouse or f"file://{tempfile.mkdtemp(prefix='causeway-bench-')}"
    settings = Settings.from_env(warehouse=warehouse)
    client = SyncNessieClient.from_settings(settings)
    world = f"bench{uuid.uuid4().hex[:8]}"
    branch = f"world-{world}"
    # Start from the repository's empty root so whatever main holds does not skew the numbers.
    client.create_branch(branch, Reference("main", "BRANCH", client.config().no_ancestor_hash))
    committer = BatchCommitter(settings, client, max_small_files=args.max_small_files)
    print(f"branch {branch}, warehouse {warehouse}", flush=True)

    offset = 0
    seq = 0
    versions: dict[int, int] = {}
    t0 = time.monotonic()
    for start in range(0, args.rows, args.seed_batch):
        items = []
        for pk in range(start, min(args.rows, start + args.seed_batch)):
            items.append((_event(world, pk, 1, ChangeType.CREATE, seq), Source(TOPIC, 0, offset)))
            versions[pk] = 1
            seq += 1
            offset += 1
        committer.commit_batch(Batch.from_sources(world, f"seed-{start}", items, settled={(TOPIC, 0): offset}))
        print(
            f"  seeded {min(args.rows, start + args.seed_batch):>9} rows  {time.monotonic() - t0:6.1f}s",
            flush=True,
        )

    latencies: list[float] = []
    cpu: list[float] = []  # process CPU seconds per flush: what a shared box distorts least
    written = rewritten = 0
    print(
        f"{'flush':>5} {'secs':>6} {'written':>8} {'deleted':>8} {'rewritten':>9} "
        f"{'MB written':>10} {'MB rewritten':>12} {'MB read':>8}",
        flush=True,
    )
    for n in range(args.flushes):
        items = []
        for pk in random.sample(range(args.rows), args.flush):
            versions[pk] += 1
            items.append((_event(world, pk, versions[pk], ChangeType.UPDATE, seq), Source(TOPIC, 0, offset)))
            seq += 1
            offset += 1
        started, cpu_started = time.monotonic(), time.process_time()
        outcome = committer.commit_batch(Batch.from_sources(world, f"flush-{n}", items, settled={(TOPIC, 0): offset}))
        latencies.append(time.monotonic() - started)
        cpu.append(time.process_time() - cpu_started)
        st = outcome.stats["entity_common"]
        written += st.rows_written
        rewritten += st.rows_rewritten
        print(
            f"{n:>5} {latencies[-1]:6.2f} {st.rows_written:>8} {st.rows_deleted:>8} {st.rows_rewritten:>9} "
            f"{st.bytes_written / 1e6:10.2f} {st.bytes_rewritten / 1e6:12.2f} {st.bytes_read / 1e6:8.2f}",
            flush=True,
        )
    table = committer.catalog(branch).load_table((settings.namespace, "entity_common"))
    state = table.scan(selected_fields=("object_pk", "version")).to_arrow()
    live = state.num_rows
    version_sum = pc.sum(state.column("version")).as_py()
    ok = live == args.rows and version_sum == sum(versions.values())
    print(
        f"\nrows={args.rows} flush={args.flush} flushes={args.flushes}: commit latency "
        f"p50={statistics.median(latencies):.2f}s p99={_pct(latencies, 0.99):.2f}s; "
        f"live rows after: {live}; versions match the model: {ok}\n"
        f"projection_buckets={getattr(settings, 'projection_buckets', 'unpartitioned')}: "
        f"rows rewritten {rewritten} / written {written} "
        f"= {rewritten / max(1, written):.2f}x; commit CPU mean {statistics.mean(cpu):.2f}s "
        f"p50 {statistics.median(cpu):.2f}s, total {sum(cpu):.1f}s; "
        f"files (data + delete) {len(table.inspect.files())}\n"
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; "
        f"key index cache {committer.file_cache._bytes / 2**20:.0f} MiB of {committer.file_cache.max_bytes / 2**20:.0f}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
