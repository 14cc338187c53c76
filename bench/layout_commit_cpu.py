"""The committer alone on a world seeded with K objects, default layout against unpartitioned.

    python -m bench.layout_commit_cpu --keys 1000000 --layout default|none

Seeds a fresh world branch with ``--keys`` objects of the keys axis's three types
(``bench.keys_seeded``; ``none`` evolves the tables to unpartitioned and unsorted first, as
``--layout none`` there), then commits ``--flushes`` batches of ``--flush`` updates of random
seeded keys and prints this process's CPU per commit (``time.process_time``: the box is shared)
and the CPU per commit stage (``bench.commit_stages``). The first ``--warmup`` flushes are left
out. It answers where the partitioned layout's extra commit CPU goes (docs/benchmarks.md, "Keys
axis"); the branch is deleted at the end.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench.commit_stages import StageTimer
from bench.keys_seeded import keyed_event
from bench.scratch import drop_world, scratch_world
from sinks.committer import Batch, BatchCommitter, Source
from sinks.layout_run import TableLayouts
from sinks.tables import ENTITY_COMMON, ENTITY_EDGE, ENTITY_EVENTS
from streams.settings import Settings


def seed(committer: BatchCommitter, settings: Settings, world: str, keys: int, batch: int, layout: str) -> None:
    if layout == "none":
        probe = keyed_event(world, keys + 100, 1, keys + 100, "seed")
        committer.commit_batch(Batch.from_sources(world, "seed-layout", [(probe, Source("seed", 1, 0))]))
        layouts = TableLayouts(settings, committer)
        for table in (ENTITY_EVENTS, ENTITY_COMMON, ENTITY_EDGE):
            layouts.evolve_text(world, table, "none", "none")
    for first in range(0, keys, batch):
        items = [
            (keyed_event(world, n, 1, n, "seed"), Source("seed", 0, n)) for n in range(first, min(keys, first + batch))
        ]
        committer.commit_batch(Batch.from_sources(world, f"seed-{first}", items))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--seed-batch", type=int, default=250_000)
    ap.add_argument("--flush", type=int, default=10_000, help="updates per commit")
    ap.add_argument("--flushes", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layout", choices=("default", "none"), default="default")
    ap.add_argument("--buckets", type=int, default=None, help="CAUSEWAY_PROJECTION_BUCKETS for the default layout")
    args = ap.parse_args()

    settings = Settings.from_env()
    if args.buckets is not None:
        settings = settings.replace(projection_buckets=args.buckets)
    settings, client, world, committer = scratch_world("lay", settings)
    try:
        seed(committer, settings, world, args.keys, args.seed_batch, args.layout)
        timer = StageTimer()
        rng = random.Random(7)
        versions: dict[int, int] = {}
        cpu: list[float] = []
        seq, offset = args.keys + 1000, 0
        with timer.installed():
            for i in range(args.flushes):
                items = []
                for _ in range(args.flush):
                    n = rng.randrange(args.keys)
                    versions[n] = versions.get(n, 2) + 1
                    items.append(
                        (keyed_event(world, n, versions[n], seq, "upd"), Source("onto.changes.objects", 0, offset))
                    )
                    seq, offset = seq + 1, offset + 1
                if i == args.warmup:
                    timer.reset()
                t0 = time.process_time()
                committer.commit_batch(Batch.from_sources(world, f"upd-{i}", items))
                if i >= args.warmup:
                    cpu.append(time.process_time() - t0)
        print(
            f"layout={args.layout} buckets={args.buckets} commits={len(cpu)} "
            f"cpu_s/commit mean={statistics.mean(cpu):.3f} median={statistics.median(cpu):.3f}"
        )
        print(timer.table(len(cpu), 0.0, sum(cpu)))
    finally:
        drop_world(client, world)


if __name__ == "__main__":
    main()
