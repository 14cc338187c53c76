"""``python -m bench.worlds``: the world manager's read paths against the real Nessie (docs/benchmarks.md).

    python -m bench.worlds                        # 1,000 commits; 1M-entity worlds differing in 10k
    python -m bench.worlds --commits 200 --entities 100000 --changed 1000   # a quick run

Builds, in a temporary warehouse and on uniquely named branches (deleted afterwards):

* a world with ``--commits`` batch commits, each changing one "hot" entity and nine others; then
  times the audit trail of the hot entity, a history page of 100 commits (with and without
  per-table counts) and a time-travel read of one entity at the middle commit (by hash and by time);
* a world of ``--entities`` objects (seeded in 100k-row flushes) and a fork of it in which
  ``--changed`` entities are updated in one flush; then times the diff of the two in a child process
  and reports its peak RSS.

Each timing is the median of ``--repeat`` runs after one warm-up. Results go to
``bench/results/<time>-worlds.json`` and are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.committer import Batch, BatchCommitter, Source
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings
from worlds.api import Worlds

RESULTS = Path(__file__).parent / "results"
TOPIC = "bench.worlds"


def _event(world: str, pk: str, version: int, n: int) -> ChangeEvent:
    return ChangeEvent(
        event_id=f"{world}-{pk}-{version}-{uuid.uuid4().hex[:8]}",
        world_id=world,
        kind=EntityKind.OBJECT,
        entity_type="person",
        entity_pk=pk,
        change_type=ChangeType.CREATE if version == 1 else ChangeType.UPDATE,
        version=version,
        before=None,
        after={"n": n, "name": f"name-{pk}", "score": n * 7 % 1000},
        caused_by=None,
        causal_order=None,
        occurred_at_ms=1_700_000_000_000,
        schema_version=0,
        source="bench",
    )


class _Writer:
    def __init__(self, settings: Settings, client: SyncNessieClient, world: str, offset: int = 0) -> None:
        self.committer = BatchCommitter(settings, client)
        self.world = world
        self.offset = offset
        self.n = 0

    def commit(self, events: list[ChangeEvent]) -> str:
        items = [(e, Source(TOPIC, 0, self.offset + i)) for i, e in enumerate(events)]
        self.offset += len(events)
        self.n += 1
        return self.committer.commit_batch(Batch.from_sources(self.world, f"{self.world}-{self.n}", items)).hash


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` runs after one warm-up, and the last result."""
    result = fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), result


def _progress(label: str, i: int, total: int, t0: float) -> None:
    if i % max(1, total // 10) == 0 or i == total:
        print(f"  {label} {i:,}/{total:,}  {time.monotonic() - t0:,.0f}s", file=sys.stderr, flush=True)


def bench_log_paths(settings: Settings, client: SyncNessieClient, root: Reference, commits: int, repeat: int) -> dict:
    world = f"bw{uuid.uuid4().hex[:8]}"
    client.create_branch(f"world-{world}", root)
    writer = _Writer(settings, client, world)
    heads = []
    t0 = time.monotonic()
    for i in range(1, commits + 1):
        events = [_event(world, "hot", i, i)] + [_event(world, f"p{i}-{j}", 1, j) for j in range(9)]
        heads.append(writer.commit(events))
        _progress("commits", i, commits, t0)
    build_s = time.monotonic() - t0
    out: dict[str, Any] = {"world": world, "commits": commits, "build_s": round(build_s, 1)}
    with Worlds(settings, client) as api:
        middle = heads[len(heads) // 2]
        out["audit_s"], trail = timed(lambda: api.audit(world, "person", "hot"), repeat)
        out["audit_changes"] = len(trail)
        scan = api.audit_scan(api.resolve(world), "person", "hot")
        assert scan is not None
        out["audit_files_planned"] = len(list(scan[1].plan_files()))
        out["events_files"] = len(list(scan[0].scan().plan_files()))
        out["history_page_s"], page = timed(lambda: list(api.history(world, limit=100, counts=False)), repeat)
        out["history_page_commits"] = len(page)
        out["history_page_counts_s"], _ = timed(lambda: _fresh_history(settings, client, world), repeat)
        out["time_travel_hash_s"], snap = timed(lambda: api.show(f"{world}@{middle}", pk="hot"), repeat)
        out["time_travel_version"] = snap.objects.column("version").to_pylist()
        when = next(r.time for r in api.history(world, limit=commits) if r.hash == middle) + timedelta(milliseconds=1)
        out["time_travel_time_s"], snap2 = timed(lambda: api.show(f"{world}@{when.isoformat()}", pk="hot"), repeat)
        out["time_travel_time_commit_ok"] = snap2.resolved.hash == middle
    return out


def _fresh_history(settings: Settings, client: SyncNessieClient, world: str) -> list:
    """A history page with counts from a cold metadata cache (a new API object each time)."""
    with Worlds(settings, client) as api:
        return list(api.history(world, limit=100, counts=True))


def bench_diff(
    settings: Settings, client: SyncNessieClient, root: Reference, entities: int, changed: int, repeat: int
) -> dict:
    world = f"bd{uuid.uuid4().hex[:8]}"
    client.create_branch(f"world-{world}", root)
    writer = _Writer(settings, client, world)
    t0 = time.monotonic()
    step = 100_000
    for start in range(0, entities, step):
        writer.commit([_event(world, f"e{k}", 1, k) for k in range(start, min(entities, start + step))])
        _progress("seed", min(entities, start + step), entities, t0)
    fork = f"{world}-b"
    head = client.get_reference(f"world-{world}")
    client.create_branch(f"world-{fork}", Reference(head.name, "BRANCH", head.hash))
    stride = max(1, entities // changed)
    other = _Writer(settings, client, fork, offset=entities)
    other.commit([_event(fork, f"e{k}", 2, -k) for k in range(0, stride * changed, stride)][:changed])
    build_s = time.monotonic() - t0
    runs = [_diff_child(world, fork, settings) for _ in range(repeat + 1)][1:]
    best = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    return {
        "world": world,
        "entities": entities,
        "changed": changed,
        "build_s": round(build_s, 1),
        "diff_s": best["seconds"],
        "diff_peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "diff_changes": best["changes"],
        "diff_stats": best["stats"],
    }


def _diff_child(a: str, b: str, settings: Settings) -> dict:
    """Run one diff in a fresh process, so its peak RSS is the diff's own."""
    env = dict(os.environ, CAUSEWAY_WAREHOUSE=settings.warehouse)
    out = subprocess.run(
        [sys.executable, "-m", "bench.worlds", "--diff-only", a, b],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _peak_rss_mib() -> float:
    """This process's own peak RSS. Linux's ``ru_maxrss`` survives ``exec``: a child forked from a
    parent that holds 1.2 GiB (the seeded world) reports at least that, so read ``VmHWM`` first."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def diff_only(a: str, b: str) -> None:
    settings = Settings.from_env()
    with Worlds.from_settings(settings) as api:
        t0 = time.perf_counter()
        result = api.diff(a, b)
        seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "seconds": round(seconds, 3),
                "peak_rss_mib": _peak_rss_mib(),
                "changes": len(result.changes),
                "stats": {t.table: t.stats() for t in result.tables},
            }
        )
    )


def _cleanup(client: SyncNessieClient, names: list[str]) -> None:
    for ref in client.list_references():
        if any(n in ref.name for n in names):
            client.delete_reference(ref.name, ref.hash, ref.type)


def markdown(result: dict) -> str:
    log, diff = result["log"], result["diff"]
    rows = [
        ("audit trail of one entity across {:,} commits".format(log["commits"]), "≤ 1 s", f"{log['audit_s']:.3f} s"),
        ("history page of 100 commits (no counts)", "≤ 200 ms", f"{log['history_page_s'] * 1000:.0f} ms"),
        (
            "history page of 100 commits (with per-table counts, cold)",
            "-",
            f"{log['history_page_counts_s'] * 1000:.0f} ms",
        ),
        ("time travel: one entity at a past commit (hash)", "≤ 1 s", f"{log['time_travel_hash_s']:.3f} s"),
        ("time travel: one entity at a past time", "≤ 1 s", f"{log['time_travel_time_s']:.3f} s"),
        (
            "diff of two {:,}-entity worlds differing in {:,}".format(diff["entities"], diff["changed"]),
            "≤ 10 s",
            f"{diff['diff_s']:.2f} s",
        ),
        ("diff peak RSS", "≤ 1 GiB", f"{diff['diff_peak_rss_mib']:,.0f} MiB"),
    ]
    lines = ["| measure | target | measured |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.worlds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--entities", type=int, default=1_000_000)
    ap.add_argument("--changed", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip", choices=["log", "diff"], default=None, help="skip one half")
    ap.add_argument("--keep", action="store_true", help="keep the worlds and their warehouse for inspection")
    ap.add_argument("--diff-only", nargs=2, metavar=("A", "B"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.diff_only:
        diff_only(*args.diff_only)
        return
    wh = tempfile.mkdtemp(prefix="bench-worlds-")
    settings = Settings.from_env().replace(warehouse=f"file://{wh}", commit_backoff_s=0.02)
    started = datetime.now(UTC)
    result: dict[str, Any] = {"started": started.isoformat(), "load": os.getloadavg(), "cpus": os.cpu_count()}
    names: list[str] = []
    with SyncNessieClient.from_settings(settings) as client:
        root = Reference("main", "BRANCH", client.config().no_ancestor_hash)
        try:
            if args.skip != "log":
                result["log"] = bench_log_paths(settings, client, root, args.commits, args.repeat)
                names.append(result["log"]["world"])
            if args.skip != "diff":
                result["diff"] = bench_diff(settings, client, root, args.entities, args.changed, args.repeat)
                names.append(result["diff"]["world"])
        finally:
            if args.keep:
                print(f"kept worlds {names} in warehouse file://{wh}", file=sys.stderr)
            else:
                _cleanup(client, names)
                shutil.rmtree(wh, ignore_errors=True)
    result["load_after"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{started.strftime('%Y%m%dT%H%M%S%z')}-worlds.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    if "log" in result and "diff" in result:
        print(markdown(result))
    print(f"saved {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
