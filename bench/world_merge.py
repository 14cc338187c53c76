"""``python -m bench.world_merge``: three-way world merge against the real Nessie (docs/benchmarks.md).

    python -m bench.world_merge                                   # 1M entities, 10k changed per side
    python -m bench.world_merge --entities 100000 --changed 1000 10000   # a quick run, two shares

Builds, in a temporary warehouse on uniquely named branches (deleted afterwards), a world of
``--entities`` objects (seeded in 100k-row flushes); then for each ``--changed`` count forks a
source and a target from it, updates that many entities on each (disjoint keys, spread over the
key space, one flush per side) and merges the source into the target (strategy NORMAL, a real
commit) in a child process, reporting its wall time and peak RSS, and what the merge read.
Results go to ``bench/results/<time>-world-merge.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.worlds import _cleanup, _event, _progress, _Writer
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings
from worlds.api import Worlds

RESULTS = Path(__file__).parent / "results"


def seed(settings: Settings, client: SyncNessieClient, root: Reference, entities: int) -> str:
    world = f"bm{uuid.uuid4().hex[:8]}"
    client.create_branch(f"world-{world}", root)
    writer = _Writer(settings, client, world)
    t0 = time.monotonic()
    step = 100_000
    for start in range(0, entities, step):
        writer.commit([_event(world, f"e{k}", 1, k) for k in range(start, min(entities, start + step))])
        _progress("seed", min(entities, start + step), entities, t0)
    return world


def one_share(settings: Settings, client: SyncNessieClient, world: str, entities: int, changed: int) -> dict:
    head = client.get_reference(f"world-{world}")
    source, target = f"{world}-s{changed}", f"{world}-t{changed}"
    for name in (source, target):
        client.create_branch(f"world-{name}", Reference(head.name, "BRANCH", head.hash))
    stride = max(2, entities // changed)
    keys = range(0, stride * changed, stride)
    t0 = time.monotonic()
    _Writer(settings, client, source, offset=10 * entities).commit([_event(source, f"e{k}", 2, -k) for k in keys])
    _Writer(settings, client, target, offset=20 * entities).commit(
        [_event(target, f"e{k + 1}", 2, -k) for k in keys]  # the neighbour keys: disjoint from the source's
    )
    build_s = time.monotonic() - t0
    env = dict(os.environ, CAUSEWAY_WAREHOUSE=settings.warehouse)
    out = subprocess.run(
        [sys.executable, "-m", "bench.world_merge", "--merge-only", source, target],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    )
    run = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "entities": entities,
        "changed_per_side": changed,
        "share": changed / entities,
        "build_s": round(build_s, 1),
        **run,
    }


def merge_only(source: str, target: str) -> None:
    settings = Settings.from_env()
    with Worlds.from_settings(settings) as api:
        t0 = time.perf_counter()
        out = api.merge_worlds(source, target, "NORMAL")
        seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "seconds": round(seconds, 3),
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "status": out.status,
                "writes": out.result.writes.num_rows,
                "taken": out.result.taken,
                "conflicts": out.result.conflict_counts,
                "attempts": out.attempts,
                "read": out.read,
            }
        )
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.world_merge", description=__doc__.split("\n\n")[0])
    ap.add_argument("--entities", type=int, default=1_000_000)
    ap.add_argument("--changed", type=int, nargs="+", default=[10_000])
    ap.add_argument("--merge-only", nargs=2, metavar=("SOURCE", "TARGET"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.merge_only:
        merge_only(*args.merge_only)
        return
    wh = tempfile.mkdtemp(prefix="bench-merge-")
    settings = Settings.from_env().replace(warehouse=f"file://{wh}", commit_backoff_s=0.02)
    started = datetime.now(UTC)
    result: dict[str, Any] = {"started": started.isoformat(), "load": os.getloadavg(), "cpus": os.cpu_count()}
    world = ""
    with SyncNessieClient.from_settings(settings) as client:
        root = Reference("main", "BRANCH", client.config().no_ancestor_hash)
        try:
            t0 = time.monotonic()
            world = seed(settings, client, root, args.entities)
            result["seed_s"] = round(time.monotonic() - t0, 1)
            result["runs"] = []
            for changed in args.changed:
                result["runs"].append(one_share(settings, client, world, args.entities, changed))
                print(json.dumps(result["runs"][-1]), file=sys.stderr, flush=True)
        finally:
            if world:
                _cleanup(client, [world])
            shutil.rmtree(wh, ignore_errors=True)
    result["load_after"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{started.strftime('%Y%m%dT%H%M%S%z')}-world-merge.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    print(f"saved {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
