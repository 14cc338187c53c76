"""CPU per batch commit of the real committer against the running Nessie (a small, quick measure).

Commits ``--commits`` batches of ``--events`` object updates (``--keys`` random keys, some links)
to a fresh world branch and reports this process's CPU seconds per commit (``time.process_time``,
not wall time: the box is shared), the Nessie contents calls and ``Transaction.table_metadata``
reads per commit, and every Nessie round trip. The first ``--warmup`` commits (table creation,
first files) are left out. ``--object-types 3`` spreads the objects over three types as the
benchmark's workload does (three object types, one link type), so a commit touches each (type,
bucket) partition of ``entity_common``; the default keeps every object a ``person``.

    python -m bench.commit_cpu --commits 30 --events 2000

``--worlds N`` commits round robin over N scratch worlds through one committer (one process, one
warehouse, the caches shared, as in a worker with N busy worlds); ``--keys`` is then per world.
The warm-up is counted per world (``--warmup`` rounds of N commits: the first creates the tables).
``--threads K`` commits K worlds at once (a thread each, as the worker's commit budget runs its
commits next to each other): a commit's CPU is its round's process CPU divided by K, so the
figure includes what K threads sharing the GIL cost each other (``--stages`` needs K = 1).
The line ends with the process caches' misses per commit: manifest reads (``sinks.manifest_cache``)
and metadata JSON parses, which stay at zero for one world and show what many worlds evict.

Measured 2026-11-30 on the shared 2-core box (CPU s per commit, mean / median over the commits
after warm-up), before / after one contents call and the once-per-change transaction metadata:
200-event batches (``--commits 40 --warmup 5 --events 200``): 0.689 / 0.673 -> 0.593 / 0.567;
2,000-event batches (``--commits 25 --warmup 3 --events 2000``): 0.827 / 0.857 -> 0.799 / 0.827;
contents calls 6 -> 1, ``table_metadata`` builds ~75 -> ~6 per commit.
1,000-event batches (``--commits 25 --warmup 5 --events 1000``, interleaved with the code before,
load 16-18), after the manifest cache, the writer-filled key index and planning without a scan:
median 0.247 / 0.226 -> 0.140 / 0.144. ``--stages`` prints wall and CPU ms per commit per stage
(docs/benchmarks.md, "Commit cost").
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from bench.commit_stages import StageTimer
from bench.scratch import add_world, drop_world, scratch_event, scratch_world
from models.events import EntityKind
from sinks import manifest_cache, table_metadata
from sinks.committer import Batch, Source
from streams.settings import Settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument(
        "--object-types",
        type=int,
        default=1,
        help="object types the keys are spread over (the benchmark's workload has 3; default 1: 'person' only)",
    )
    ap.add_argument("--worlds", type=int, default=1, help="worlds committed round robin (--keys per world)")
    ap.add_argument("--stages", action="store_true", help="print wall and CPU ms per commit per stage (markdown)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="commits in flight at once, each on its own world (as the worker's commit budget runs them); "
        "a commit's CPU is then its round's process CPU / threads",
    )
    args = ap.parse_args()

    base = Settings.from_env()
    settings, client, first, committer = scratch_world("cpu", base)
    worlds = [first] + [add_world(client, "cpu") for _ in range(args.worlds - 1)]

    counts = {"contents": 0, "metadata": 0, "nessie": 0}
    send = client._send

    def counting_send(call: Any) -> object:  # every Nessie round trip; contents calls apart
        counts["nessie"] += 1
        counts["contents"] += call.path.endswith("/contents")
        return send(call)

    client._send = counting_send  # type: ignore[method-assign,assignment]
    real_build = table_metadata.build

    def counting_build(*a: object, **kw: object) -> object:
        counts["metadata"] += 1
        return real_build(*a, **kw)  # type: ignore[arg-type]

    table_metadata.build = counting_build  # type: ignore[assignment]

    timer = StageTimer()
    stages = timer.installed() if args.stages else contextlib.nullcontext(timer)
    rng = random.Random(7)
    versions: dict[tuple[str, str], int] = {}
    offset = 0
    warmup = args.warmup * len(worlds)
    settled = round_start = 0
    cpu: list[float] = []
    wall: list[float] = []
    contents: list[float] = []
    trips: list[float] = []
    metadata: list[float] = []
    parsed: list[float] = []
    manifest_reads: list[float] = []
    creating: list[float] = []  # each world's first commit (it creates the three tables)
    pending: list[tuple[int, Batch]] = []
    pool = ThreadPoolExecutor(max(1, args.threads), thread_name_prefix="commit")
    try:
        stages.__enter__()
        for i in range(warmup + args.commits - args.warmup):  # --commits counts one world's warm-up
            world = worlds[i % len(worlds)]
            if i % len(worlds) == 0:  # what every world committed before the last round is settled
                settled, round_start = round_start, offset
            items = []
            for n in range(args.events):
                kind = EntityKind.LINK if n % 10 == 0 else EntityKind.OBJECT
                pk = f"k{rng.randrange(args.keys)}"
                version = versions[world, pk] = versions.get((world, pk), 0) + 1
                topic = "onto.changes.links" if kind is EntityKind.LINK else "onto.changes.objects"
                event = scratch_event(world, kind, pk, version, n)
                if kind is EntityKind.OBJECT and args.object_types > 1:  # a key keeps its type
                    event = replace(event, entity_type=f"type{int(pk[1:]) % args.object_types}")
                items.append((event, Source(topic, 0, offset)))
                offset += 1
            floors = {("onto.changes.objects", 0): settled, ("onto.changes.links", 0): settled}
            pending.append((i, Batch.from_sources(world, f"cpu-{i}", items, settled=floors)))
            last = i == warmup + args.commits - args.warmup - 1
            if len(pending) < args.threads and not last and (i + 1) % len(worlds) and i + 1 != warmup:
                continue  # a round holds distinct worlds, and never mixes warm-up with counted commits
            counts.update(contents=0, metadata=0, nessie=0)
            parses, misses = table_metadata.CACHE.parses, manifest_cache.CACHE.misses
            if pending[0][0] == warmup:
                timer.reset()
            n = len(pending)
            w0, t0 = time.perf_counter(), time.process_time()
            if n == 1:
                committer.commit_batch(pending[0][1])
            else:
                list(pool.map(committer.commit_batch, [b for _, b in pending]))
            spent = (time.process_time() - t0) / n
            for j, _ in pending:
                if j < len(worlds):
                    creating.append(spent)
                if j >= warmup:
                    wall.append((time.perf_counter() - w0) / n)
                    cpu.append(spent)
                    contents.append(counts["contents"] / n)
                    trips.append(counts["nessie"] / n)
                    metadata.append(counts["metadata"] / n)
                    parsed.append((table_metadata.CACHE.parses - parses) / n)
                    manifest_reads.append((manifest_cache.CACHE.misses - misses) / n)
            pending.clear()
    finally:
        stages.__exit__(None, None, None)
        pool.shutdown()
        table_metadata.build = real_build
        for world in worlds:
            drop_world(client, world)
    print(
        f"worlds={len(worlds)} threads={args.threads} commits={len(cpu)} events/commit={args.events} "
        f"cpu_s/commit mean={statistics.mean(cpu):.4f} "
        f"median={statistics.median(cpu):.4f} min={min(cpu):.4f} "
        f"contents_calls/commit={statistics.mean(contents):.1f} nessie_round_trips/commit={statistics.mean(trips):.1f} "
        f"metadata_builds/commit={statistics.mean(metadata):.1f} "
        f"metadata_parses/commit={statistics.mean(parsed):.1f} "
        f"manifest_reads/commit={statistics.mean(manifest_reads):.1f} "
        f"wall_s/commit mean={statistics.mean(wall):.4f} median={statistics.median(wall):.4f} "
        f"first_commit_cpu_s mean={statistics.mean(creating):.4f} "
        f"held: manifest_entries={manifest_cache.CACHE._entries}/{manifest_cache.CACHE.max_entries} "
        f"key_index_MiB={committer.file_cache._bytes / 2**20:.1f} "
        f"rows_MiB={committer.file_cache._rows_bytes / 2**20:.1f}"
    )
    if args.stages:
        print(timer.table(len(cpu), sum(wall), sum(cpu)))


if __name__ == "__main__":
    main()
