"""CPU and peak memory of one reconciliation pass, at two world sizes: the first pass (everything
read) and the next one after a flush-sized change (only the change read).

    python -m bench.reconcile_cost --keys 50000,200000 --change 5000

Per size, a fresh world branch on a warehouse of its own is seeded with ``keys`` objects by the
committer (``--seed-batch`` per commit, as ``bench.keys_seeded`` does), then one ``Reconciler``
(the worker's child keeps one) runs a dry-run pass, ``--change`` events (half updates of seeded
keys, half fresh keys) are committed, and the same ``Reconciler`` runs another pass. Each pass
reports CPU seconds of this process (``time.process_time``: every thread) and the peak RSS
above the RSS before it (sampled every 20 ms). ``--baseline PATH`` also runs ``causeway
reconcile --dry-run`` of the tree at PATH (e.g. /work/main before this change) on each seeded
world under ``/usr/bin/time`` for its CPU and peak RSS. The branches it created are deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from agents.reconcile import Reconciler
from bench.harness import RESULTS
from bench.keys_seeded import keyed_event
from sinks.committer import Batch, BatchCommitter, Source
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Peak RSS while the block runs, sampled by a thread."""

    def __enter__(self) -> PeakRss:
        self.before = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def measured_pass(rec: Reconciler, world: str) -> dict[str, Any]:
    cpu, wall = time.process_time(), time.monotonic()
    with PeakRss() as rss:
        report = rec.check(world, dry_run=True)
    point = rec.checkpoints.get(world)
    return {
        "outcome": report.outcome,
        "drift": report.drift,
        "cpu_s": round(time.process_time() - cpu, 2),
        "wall_s": round(time.monotonic() - wall, 2),
        "rss_before_mib": rss.before >> 20,
        "peak_above_before_mib": (rss.peak - rss.before) >> 20,
        "rows_read": point.read_rows if point else None,
        "rows_digested": point.digested if point else None,
        "checkpoint_mib": (point.nbytes() >> 20) if point else None,
    }


def baseline(tree: str, s: Settings, world: str) -> dict[str, Any]:
    """``causeway reconcile --dry-run`` of another tree on the world, under /usr/bin/time -v."""
    env = dict(os.environ, PYTHONPATH=tree, CAUSEWAY_WAREHOUSE=s.warehouse, CAUSEWAY_MAIN_BRANCH=s.main_branch)
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "cli.main", "reconcile", "--world", world, "--dry-run"]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    stats = {}
    for line in out.stderr.splitlines():
        k, _, v = line.strip().rpartition(": ")
        stats[k] = v
    return {
        "cpu_s": round(float(stats.get("User time (seconds)", 0)) + float(stats.get("System time (seconds)", 0)), 2),
        "peak_rss_mib": int(stats.get("Maximum resident set size (kbytes)", 0)) >> 10,
        "exit": out.returncode,
    }


def one_size(base: Settings, keys: int, change: int, seed_batch: int, tree: str | None) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    world = f"rc{tag}"
    tmp = tempfile.mkdtemp(prefix=f"reccost-{tag}-")
    s = base.replace(warehouse=f"file://{tmp}/warehouse", main_branch=f"rc-main-{tag}")
    client = SyncNessieClient(s.nessie_url)
    branch = f"world-{world}"
    client.create_branch(branch, Reference("main", "BRANCH", client.config().no_ancestor_hash))
    try:
        committer = BatchCommitter(s, client)
        started = time.monotonic()
        for first in range(0, keys, seed_batch):
            items = [
                (keyed_event(world, n, 1, n, tag), Source("seed", 0, n))
                for n in range(first, min(keys, first + seed_batch))
            ]
            committer.commit_batch(Batch.from_sources(world, f"seed-{first}", items))
        seeded = round(time.monotonic() - started, 1)
        out: dict[str, Any] = {"keys": keys, "change": change, "world": world, "seed_s": seeded}
        if tree:
            out["baseline_first"] = baseline(tree, s, world)
        rec = Reconciler(s, committer)
        out["first"] = measured_pass(rec, world)
        items = [
            (
                keyed_event(world, n if i % 2 else keys + i, 2 if i % 2 else 1, keys + i, tag),
                Source("seed", 0, keys + i),
            )
            for i, n in enumerate(range(0, keys, max(1, keys // change)))
        ][:change]
        for first in range(0, len(items), 2500):  # flush-sized commits
            committer.commit_batch(Batch.from_sources(world, f"change-{first}", items[first : first + 2500]))
        out["next"] = measured_pass(rec, world)
        out["again"] = measured_pass(rec, world)  # nothing changed
        return out
    finally:
        ref = client.get_reference(branch)
        client.delete_reference(branch, ref.hash)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="50000,200000", help="world sizes (objects), comma-separated")
    ap.add_argument("--change", type=int, default=5000, help="events committed between the two passes")
    ap.add_argument("--seed-batch", type=int, default=25000)
    ap.add_argument("--baseline", default=None, help="another tree whose CLI reconcile is timed on each world")
    args = ap.parse_args(argv)
    base = Settings.from_env()
    run_id = uuid.uuid4().hex[:8]
    results = {
        "run_id": run_id,
        "load_before": os.getloadavg(),
        "sizes": [one_size(base, int(k), args.change, args.seed_batch, args.baseline) for k in args.keys.split(",")],
        "load_after": os.getloadavg(),
    }
    path = Path(RESULTS) / f"reconcile-cost-{run_id}.json"
    path.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
