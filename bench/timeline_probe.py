"""When a worker reads, processes and commits during a benchmark run: the pipeline's timeline.

``bench.commit_probe`` says what one commit costs; this says whether the intake and the commits
overlap. It found that a small-profile drain read 40,000 events before its first commit started,
then committed while the intake had 10,000 left, then waited half a second for the rest
(docs/benchmarks.md, 2026-12-03 morning). Loaded into the worker only, like the other probes::

    BENCH_TIMELINE_PROBE=/tmp/timeline.json PYTHONPATH=$PWD/bench/worker_probe:$PWD \\
        python -m bench run --contenders causeway
    python -m bench.timeline_probe /tmp/timeline.json [--until 5 --min-poll 100]

Records, in seconds since the worker started: each poll that handed records over (``poll``: the
intake's step, getmany included), the applier's work on it (``process``), each flush of a world
(``flush``: commit, marks, gate and offsets) and each Nessie commit in its thread (``commit``).
The file is rewritten every 2 s and at exit.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.probe_file import keep_written

ENV = "BENCH_TIMELINE_PROBE"
KINDS = ("poll", "process", "flush", "commit")


@dataclass(frozen=True)
class Span:
    kind: str
    start: float
    end: float
    events: int
    world: str = ""


def install(path: str) -> list[Span]:
    """Wrap the intake's step, the applier's process and flush and the committer; returns the list filled."""
    from agents import applier as applier_mod
    from agents import intake as intake_mod
    from sinks import committer as committer_mod

    t0 = time.monotonic()
    spans: list[Span] = []

    def now() -> float:
        return time.monotonic() - t0

    step = intake_mod.ChangeIntake.step

    async def timed_step(self: Any) -> int:
        start = now()
        n = await step(self)
        if n:
            spans.append(Span("poll", start, now(), n))
        return n

    process = applier_mod.Applier.process

    async def timed_process(self: Any, records: Any) -> Any:
        start = now()
        try:
            return await process(self, records)
        finally:
            spans.append(Span("process", start, now(), len(records)))

    commit_items = applier_mod.Applier._commit_items  # noqa: SLF001 - a probe

    async def timed_flush(self: Any, world: str, items: Any, failed: Any) -> None:
        start = now()
        try:
            await commit_items(self, world, items, failed)
        finally:
            spans.append(Span("flush", start, now(), len(items), world))

    commit_batch = committer_mod.BatchCommitter.commit_batch

    def timed_commit(self: Any, batch: Any) -> Any:
        start = now()
        try:
            return commit_batch(self, batch)
        finally:
            spans.append(Span("commit", start, now(), len(batch.events), batch.world_id))

    intake_mod.ChangeIntake.step = timed_step  # type: ignore[method-assign]
    applier_mod.Applier.process = timed_process  # type: ignore[method-assign]
    applier_mod.Applier._commit_items = timed_flush  # type: ignore[method-assign]  # noqa: SLF001
    committer_mod.BatchCommitter.commit_batch = timed_commit  # type: ignore[method-assign]

    keep_written(path, lambda: [vars(s) for s in list(spans)], 2.0, "timeline probe")
    return spans


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersect(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summary(spans: Sequence[Span], until: float | None = None, min_poll: int = 0) -> dict[str, float]:
    """The drain's shape: from the first poll with records to the end of the last poll or flush
    (of those starting before ``until``; polls of fewer than ``min_poll`` records left out, so that
    a drain's figures stop where the trickle of the next phase begins).

    ``busy_s``: some poll or flush was running; ``overlap_s``: a poll and a flush at once;
    ``idle_s``: neither (the pipeline waited: an age or idle minimum, a poll timeout);
    ``first_flush_after_s``: from the first poll to the first flush; ``tail_s``: from the last
    poll's end to the last flush's end.
    """
    spans = [s for s in spans if until is None or s.start < until]
    polls = [s for s in spans if s.kind == "poll" and s.events >= min_poll]
    flushes = [s for s in spans if s.kind == "flush"]
    if not polls or not flushes:
        return {}
    start = min(s.start for s in polls)
    last_poll, last_flush = max(s.end for s in polls), max(s.end for s in flushes)
    end = max(last_poll, last_flush)
    intake = _union((s.start, s.end) for s in polls)
    commits = _union((s.start, s.end) for s in flushes)
    busy = _length(_union([*intake, *commits]))
    return {
        "span_s": round(end - start, 3),
        "events_polled": sum(s.events for s in polls),
        "events_flushed": sum(s.events for s in flushes),
        "flushes": len(flushes),
        "first_flush_after_s": round(min(s.start for s in flushes) - start, 3),
        "intake_s": round(_length(intake), 3),
        "flushing_s": round(_length(commits), 3),
        "overlap_s": round(_intersect(intake, commits), 3),
        "idle_s": round(end - start - busy, 3),
        "tail_s": round(max(0.0, last_flush - last_poll), 3),
    }


def load(path: str) -> list[Span]:
    return [Span(**d) for d in json.loads(Path(path).read_text())]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.timeline_probe",
        description="Show a worker's poll, flush and commit timeline recorded by BENCH_TIMELINE_PROBE.",
        epilog="example (the small profile's preload): python -m bench.timeline_probe t.json --until 3 --min-poll 100",
    )
    parser.add_argument("path")
    parser.add_argument("--until", type=float, default=None, help="only spans starting before this (s)")
    parser.add_argument("--min-poll", type=int, default=0, help="leave out polls of fewer records (a trickle)")
    parser.add_argument("--json", action="store_true", help="the summary as JSON")
    args = parser.parse_args(argv)
    spans = load(args.path)
    figures = summary(spans, args.until, args.min_poll)
    if args.json:
        print(json.dumps(figures))
        return
    for s in sorted(spans, key=lambda s: s.start):
        if (args.until is None or s.start < args.until) and s.kind != "process":
            print(f"{s.kind:7} {s.start:8.3f} {s.end:8.3f} {s.end - s.start:6.3f}s {s.events:6d} {s.world}")
    for k, v in figures.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
