"""Per-commit stage timings inside a running worker, under the benchmark's own load.

``bench.commit_stages`` times a committer alone; what a worker's commit waits for (the other
worlds' commits, intake, Nessie under load) only shows inside the worker during a benchmark run.
The probe is loaded into the worker process only, through ``bench/worker_probe/sitecustomize.py``::

    BENCH_COMMIT_PROBE=/tmp/probe.json PYTHONPATH=$PWD/bench/worker_probe:$PWD \
        python -m bench run --contenders causeway
    python -m bench.commit_probe /tmp/probe.json bench/results/<run>.json

Per commit it records each stage of :data:`bench.commit_stages.STAGES` (wall, and the CPU of the
committing thread: pyiceberg's pool threads are not in it), the ``asyncio.to_thread`` queueing, the
time from the commit's return to the end of its flush (``settled``: marks, gate and offsets; in a
tree where the flush took the applier's lock back after the commit, that wait is in it and also
recorded alone as ``relock``), the time from a world's commit returning to its next commit being
submitted, how late a 5 ms sleep on the worker's event loop wakes, and, apart, how late a thread
sleeping 2 ms wakes (the GIL and the OS scheduler). The report splits the records into the run's latency phases
(the first small commit after the preload starts the first phase; each lasts its ``wall_s``).
The file is rewritten every 3 s and at exit (a SIGKILLed worker leaves the last one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.commit_stages import STAGES, StageTimer
from bench.probe_file import keep_written, write_json

ENV = "BENCH_COMMIT_PROBE"


class CommitProbe(StageTimer):
    """Stage times per commit, in the committing thread (several worlds commit at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self.wakeups: list[float] = []
        self._per_thread = threading.local()
        self._submitted: dict[str, float] = {}
        self.keep: Any = None
        self.loop_lag: list[tuple[float, float]] | None = None
        self.keep_lagging: Any = None

    def _wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        local = self._per_thread

        def timed(*a: Any, **kw: Any) -> Any:
            stages: dict[str, list[float]] | None = getattr(local, "stages", None)
            depth: dict[str, int] | None = getattr(local, "depth", None)
            if stages is None or depth is None:
                return fn(*a, **kw)  # not inside a commit (or in a pool thread)
            outer = depth[label] == 0
            depth[label] += 1
            w, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                depth[label] -= 1
                if outer:
                    s = stages.setdefault(label, [0.0, 0.0, 0.0])
                    s[0] += time.perf_counter() - w
                    s[1] += time.thread_time() - c
                    s[2] += 1

        return timed

    def patch_commit(self) -> None:
        """Time whole commits, their queueing and the lock taken back (the worker's own seams)."""
        from agents import flushing
        from sinks import committer as committer_module

        probe, local = self, self._per_thread
        commit_batch = committer_module.BatchCommitter.commit_batch
        commit_async = committer_module.BatchCommitter.commit_batch_async

        async def submitted(self: Any, batch: Any) -> Any:
            probe._submitted[batch.batch_id] = time.perf_counter()
            return await commit_async(self, batch)

        def committed(self: Any, batch: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            local.stages, local.depth = {}, defaultdict(int)
            try:
                return commit_batch(self, batch)
            finally:
                probe.records.append(
                    {
                        "t": time.time(),
                        "batch": batch.batch_id,
                        "world": batch.world_id,
                        "rows": len(batch.events),
                        "queue": start - probe._submitted.pop(batch.batch_id, start),
                        "wall": time.perf_counter() - start,
                        "end": time.perf_counter(),
                        "cpu": time.thread_time() - cpu,
                        "stages": local.stages,
                    }
                )
                local.stages = local.depth = None

        async def timed_unlocked(self: Any, batch: Any) -> Any:  # UnlockedCommits', the lock's return timed
            self.lock.release()
            try:
                return await self.inner.commit_batch_async(batch)
            finally:
                back = time.perf_counter()
                await asyncio.shield(self.lock.acquire())
                probe.records.append({"batch": batch.batch_id, "relock": time.perf_counter() - back})

        run, schedule = flushing.FlushScheduler._run, flushing.FlushScheduler.schedule

        def scheduling(self: Any, worlds: Any) -> None:  # the first call starts the loop's lag probe
            if probe.loop_lag is None:
                probe.loop_lag = []
                probe.keep_lagging = asyncio.get_running_loop().create_task(probe.lagging())  # referenced
            schedule(self, worlds)

        flushing.FlushScheduler.schedule = scheduling  # type: ignore[method-assign]

        async def timed_run(self: Any, world: str) -> None:  # a background flush's end: its batch settled
            try:
                await run(self, world)
            finally:
                probe.records.append({"flushed": world, "end": time.perf_counter()})

        committer_module.BatchCommitter.commit_batch = committed  # type: ignore[method-assign]
        committer_module.BatchCommitter.commit_batch_async = submitted  # type: ignore[method-assign]
        flushing.FlushScheduler._run = timed_run  # type: ignore[method-assign]
        unlocked: Any = getattr(flushing, "UnlockedCommits", None)  # trees before the lock-free settle
        if unlocked is not None:
            unlocked.commit_batch_async = timed_unlocked

    async def lagging(self) -> None:
        """How late a 5 ms sleep on the worker's event loop wakes: the loop busy (intake, settles)."""
        assert self.loop_lag is not None
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            self.loop_lag.append((time.time(), time.perf_counter() - t - 0.005))
            if len(self.loop_lag) > 200_000:
                del self.loop_lag[:100_000]

    def sleeper(self) -> None:
        while True:
            t = time.perf_counter()
            time.sleep(0.002)
            self.wakeups.append(time.perf_counter() - t - 0.002)
            if len(self.wakeups) > 200_000:
                del self.wakeups[:100_000]

    def state(self) -> dict[str, Any]:
        return {"records": list(self.records), "wakeups": list(self.wakeups), "loop_lag": list(self.loop_lag or ())}

    def dump(self, path: str) -> None:
        write_json(path, self.state())


def install(path: str) -> CommitProbe:
    """Install the probe in this process (the worker) and keep ``path`` up to date."""
    probe = CommitProbe()
    probe.keep = probe.installed()  # referenced: a collected generator would undo the patches
    probe.keep.__enter__()  # for the life of the process
    probe.patch_commit()

    threading.Thread(target=probe.sleeper, name="probe sleeper", daemon=True).start()
    keep_written(path, probe.state, 3.0, "probe dump")
    print(f"commit probe installed, writing {path}", file=sys.stderr)
    return probe


def phases(records: list[dict[str, Any]], result: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The commit records of each latency phase of ``result`` (a ``bench run`` JSON)."""
    commits = [r for r in records if "stages" in r]
    walls = [(p["offered_rate"], p["worker"]["wall_s"]) for p in result["contenders"]["causeway"]["latency_phases"]]
    first = next((i for i in range(1, len(commits)) if commits[i]["rows"] < 100 <= commits[i - 1]["rows"]), None)
    if first is None or not walls:
        return [("all", commits)]
    start = commits[first]["t"] - commits[first]["wall"]
    out = []
    for rate, wall in walls:
        out.append((f"{rate}/s", [r for r in commits if start <= r["t"] < start + wall]))
        start += wall
    return out


def settled_after(records: list[dict[str, Any]]) -> dict[str, float]:
    """Per batch: seconds from its commit's return to the end of the flush that made it (the first
    flush of its world to end after the commit returned)."""
    ends: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if "flushed" in r:
            ends[r["flushed"]].append(r["end"])
    out = {}
    for r in records:
        if "stages" in r and "end" in r:
            later = [e for e in ends.get(r["world"], ()) if e >= r["end"]]
            if later:
                out[r["batch"]] = min(later) - r["end"]
    return out


def next_commit_gaps(records: list[dict[str, Any]]) -> dict[str, float]:
    """Per batch: seconds from the previous commit of its world returning to this batch being
    submitted; while a world's batch is due at once (high rates), the time the world spends not
    committing (settling the last batch, taking and building the next)."""
    out: dict[str, float] = {}
    last: dict[str, dict[str, Any]] = {}
    for r in sorted((r for r in records if "stages" in r and "end" in r), key=lambda r: r["end"]):
        previous = last.get(r["world"])
        if previous is not None:
            out[r["batch"]] = r["end"] - r["wall"] - r["queue"] - previous["end"]
        last[r["world"]] = r
    return out


def _ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    p90 = sorted(values)[int(0.9 * (len(values) - 1))]
    return f"{1000 * statistics.mean(values):.1f} ms (p90 {1000 * p90:.1f})"


def report(probe_path: Path, result_path: Path) -> str:
    data = json.loads(probe_path.read_text())
    relock = {r["batch"]: r["relock"] for r in data["records"] if "relock" in r}
    settled = settled_after(data["records"])
    gaps = next_commit_gaps(data["records"])
    lines = []
    for name, sel in phases(data["records"], json.loads(result_path.read_text())):
        if not sel:
            continue
        n = len(sel)
        agg: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for r in sel:
            for label, (w, c, calls) in r["stages"].items():
                a = agg[label]
                a[0], a[1], a[2] = a[0] + w, a[1] + c, a[2] + calls
        back = [relock[r["batch"]] for r in sel if r["batch"] in relock]
        after = [settled[r["batch"]] for r in sel if r["batch"] in settled]
        t0, t1 = min(r["t"] - r["wall"] for r in sel), max(r["t"] for r in sel)
        lag = [x for t, x in data.get("loop_lag", ()) if t0 <= t <= t1]
        lines += [
            f"### {name}: {n} commits, {statistics.mean(r['rows'] for r in sel):.0f} rows each",
            "",
            f"a 5 ms sleep on the worker's event loop woke {_ms(lag)} late ({len(lag)} sleeps)",
            "",
            f"commit wall {statistics.mean(r['wall'] for r in sel):.3f} s, committing thread's CPU "
            f"{statistics.mean(r['cpu'] for r in sel):.3f} s, to_thread queueing "
            f"{1000 * statistics.mean(r['queue'] for r in sel):.1f} ms, lock taken back {_ms(back)}, "
            f"settled after the commit returned {_ms(after)}, from the world's previous commit returning to "
            f"this one submitted {_ms([gaps[r['batch']] for r in sel if r['batch'] in gaps])}",
            "",
            "| stage | wall ms / commit | thread CPU ms / commit | calls / commit |",
            "| --- | --- | --- | --- |",
        ]
        order = {label: i for i, (label, _, _) in enumerate(STAGES)}
        for label, (w, c, calls) in sorted(agg.items(), key=lambda kv: order.get(kv[0], 0)):
            lines.append(f"| {label} | {1000 * w / n:.1f} | {1000 * c / n:.1f} | {calls / n:.1f} |")
        lines.append("")
    big = [r for r in data["records"] if "stages" in r and r["rows"] >= 600]
    if big:
        lines.append(
            f"whole run, {len(big)} commits of 600 rows or more: lock taken back "
            f"{_ms([relock[r['batch']] for r in big if r['batch'] in relock])}, settled after the commit "
            f"returned {_ms([settled[r['batch']] for r in big if r['batch'] in settled])}"
        )
    late = data["wakeups"]
    if late:
        lines.append(f"a 2 ms sleep woke {1000 * statistics.mean(late):.2f} ms late on average ({len(late)} sleeps)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe", type=Path, help="the file BENCH_COMMIT_PROBE named")
    parser.add_argument("result", type=Path, help="the run's bench/results/*.json")
    args = parser.parse_args()
    print(report(args.probe, args.result))


if __name__ == "__main__":
    main()
