"""The committer alone on a world of K objects, committing batches of mostly fresh keys: CPU per commit.

    python -m bench.lookup_cpu --keys 1000000 [--flush 3000 --fresh 0.8 --flushes 8]

Seeds a fresh world branch with ``--keys`` objects (``bench.layout_commit_cpu.seed``, the keys
axis's three types, default layout), then commits ``--flushes`` batches of ``--flush`` events, a
``--fresh`` share of them creates of keys never seen (the soak's fresh keys) and the rest updates of
random seeded keys. Prints this process's CPU per commit (``time.process_time``: the box is shared),
split into the projections' key lookup (``read_state``) and the rest, plus the rows the lookups
returned and the stage table (``bench.commit_stages``). The first ``--warmup`` commits are left out.
Answers whether a flush's lookup follows the batch or the world (issues 13 and 21; docs/benchmarks.md,
"Key lookup follows the batch"); the branch is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from bench.commit_stages import StageTimer
from bench.keys_seeded import keyed_event
from bench.layout_commit_cpu import seed
from bench.scratch import drop_world, scratch_world
from sinks.committer import Batch, Source
from streams.settings import Settings

LOOKUP = "  key lookup (plan + read)"


class Reads:
    """Counts what the flushes' key lookups planned and read (``TableState``'s counters, when present)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lookups = self.files = self.files_read = self.rows_read = 0

    def install(self) -> None:
        from sinks import projection_write

        original = projection_write.read_state

        def counted(*a: Any, **kw: Any) -> Any:
            state = original(*a, **kw)
            self.lookups += 1
            self.files += len(state.files)
            # Before the key filters the lookup read every planned file, and all of its rows.
            self.files_read += getattr(state, "files_read", len(state.files))
            every = sum(f.data_file.record_count for f in state.files.values())
            self.rows_read += getattr(state, "rows_read", every)
            return state

        projection_write.read_state = counted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--seed-batch", type=int, default=250_000)
    ap.add_argument("--flush", type=int, default=3_000, help="events per commit")
    ap.add_argument("--fresh", type=float, default=0.8, help="share of a commit's events that create new keys")
    ap.add_argument("--flushes", type=int, default=8)
    ap.add_argument(
        "--updates-of",
        choices=("recent", "any"),
        default="recent",
        help="recent: keys created by the last 10 commits (the soak's live chunk); any: any seeded key",
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--window", type=int, default=0, help="also print the stages per window of N commits")
    args = ap.parse_args()

    settings, client, world, committer = scratch_world("lkp", Settings.from_env())
    load = open("/proc/loadavg").read().split()[0]
    try:
        seed(committer, settings, world, args.keys, args.seed_batch, "default")
        timer, window = StageTimer(), StageTimer()
        reads = Reads()
        reads.install()
        rng = random.Random(11)
        versions: dict[int, int] = {}
        cpu: list[float] = []
        lookup: list[float] = []
        seq, offset, fresh = args.keys + 1000, 0, args.keys + 10_000_000
        with timer.installed(), window.installed():
            created: list[int] = []
            chunks: list[int] = []  # len(created) before each commit
            for i in range(args.flushes):
                chunks.append(len(created))
                recent = created[chunks[max(0, i - 10)] :]
                items = []
                for _ in range(args.flush):
                    if rng.random() < args.fresh:
                        n, version, fresh = fresh, 1, fresh + 1
                        created.append(n)
                    else:
                        n = rng.choice(recent) if args.updates_of == "recent" and recent else rng.randrange(args.keys)
                        version = versions[n] = versions.get(n, 2 if n < args.keys else 1) + 1
                    items.append(
                        (keyed_event(world, n, version, seq, "lkp"), Source("onto.changes.objects", 0, offset))
                    )
                    seq, offset = seq + 1, offset + 1
                if i == args.warmup:
                    reads.reset()
                    timer.reset()
                    window.reset()
                before = timer.cpu.get(LOOKUP, 0.0)
                t0 = time.process_time()
                committer.commit_batch(Batch.from_sources(world, f"lkp-{i}", items))
                if i >= args.warmup:
                    cpu.append(time.process_time() - t0)
                    lookup.append(timer.cpu.get(LOOKUP, 0.0) - before)
                if args.window and i >= args.warmup and (i + 1 - args.warmup) % args.window == 0:
                    last = cpu[-args.window :]
                    print(f"commits {i + 1 - args.window}-{i}: cpu_s/commit {statistics.mean(last):.3f}")
                    print(window.table(args.window, 0.0, sum(last)))
                    window.reset()
        out = {
            "keys": args.keys,
            "flush": args.flush,
            "fresh": args.fresh,
            "updates_of": args.updates_of,
            "commits": len(cpu),
            "cpu_s_per_commit_mean": round(statistics.mean(cpu), 4),
            "cpu_s_per_commit_median": round(statistics.median(cpu), 4),
            "lookup_cpu_s_mean": round(statistics.mean(lookup), 4),
            "rest_cpu_s_mean": round(statistics.mean(cpu) - statistics.mean(lookup), 4),
            "files_per_lookup": round(reads.files / max(1, reads.lookups), 1),
            "files_read_per_lookup": round(reads.files_read / max(1, reads.lookups), 1),
            "rows_read_per_lookup": round(reads.rows_read / max(1, reads.lookups)),
            "load_start": load,
            "load_end": open("/proc/loadavg").read().split()[0],
        }
        print(json.dumps(out))
        print(timer.table(len(cpu), 0.0, sum(cpu)))
    finally:
        drop_world(client, world)


if __name__ == "__main__":
    main()
