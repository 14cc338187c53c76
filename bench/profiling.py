"""Summaries of py-spy ``--format raw`` profiles (collapsed stacks) taken by ``python -m bench run --py-spy``.

Each line of a raw profile is ``frame;frame;...;leaf count``. The summary names, per function, the
share of samples where it is the leaf (self time) and where it is anywhere on the stack (inclusive,
counted once per stack), so the top costs can be read without a flame-graph viewer.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^():]+)(?::\d+)?\)$")


def _name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('func')} ({path})"


def summarize(path: Path, top: int = 15) -> dict[str, Any]:
    self_counts: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        n = int(count_s)
        frames = [_name(f) for f in stack.split(";")]
        # py-spy's raw stacks begin with the process / thread names; they are not functions.
        frames = [f for f in frames if "(" in f]
        if not frames:
            continue
        total += n
        self_counts[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    share = lambda c: round(100 * c / total, 1) if total else 0.0  # noqa: E731
    return {
        "samples": total,
        "self_pct": [(f, share(c)) for f, c in self_counts.most_common(top)],
        "inclusive_pct": [(f, share(c)) for f, c in incl.most_common(top * 3)],
    }


def summarize_dir(work: Path) -> dict[str, Any]:
    return {p.name: summarize(p) for p in sorted(work.glob("*.pyspy.txt"))}


COMMIT_STAGE = "commit (Nessie + Iceberg, worker threads)"

#: Stages of the worker's hot path, by a function on the sample's stack: the first stage (in this
#: order) with a pattern anywhere on the stack takes the sample. ``setup`` is the harness's own work
#: (imports, generating and publishing the workload, clean-up), left out of the per-event figures.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "setup",
        (
            "_find_and_load (",
            "generate (cli/workload.py)",
            "_publish (bench/hotpath.py)",
            "_cleanup (bench/hotpath.py)",
            "ensure_topics (",
            "(aiokafka/producer/sender.py)",
            "ChangeIntake.start (",
        ),
    ),
    # Worker threads: the commit (``asyncio.to_thread``) and pyiceberg's own file-writing pool.
    (COMMIT_STAGE, ("Thread._bootstrap (",)),
    ("batch building (Batch.from_sources)", ("Batch.from_sources (",)),
    ("redis: mark applied", ("AppliedMarks.mark (",)),
    ("redis: dedupe lookup", ("AppliedMarks.applied (",)),
    ("redis: dead-letter decisions", ("Applier._settle_replays (", "Decisions.", "DeadLetterMarks.")),
    ("dead-letter publish", ("DeadLetterPublisher.", "Applier._letter (")),
    ("decode + validate", ("decode (models/events.py)",)),
    ("causal gate", ("(agents/causal.py)",)),
    ("dedupe split", ("(agents/dedupe.py)",)),
    ("metrics", ("(monitoring/metrics.py)", "prometheus_client/")),
    ("offset tracker", ("(agents/offset_tracker.py)",)),
    ("batching + flush scheduling", ("(agents/batching.py)", "(agents/flushing.py)")),
    ("intake: RawRecord building", ("ChangeIntake.admit (",)),
    ("intake: Kafka offset commit", ("ChangeIntake._commit (",)),
    ("intake: Kafka fetch + record decode", ("(aiokafka/",)),
    ("applier: rest", ("(agents/applier.py)",)),
    ("intake: rest", ("(agents/intake.py)",)),
)


def stages(path: Path) -> dict[str, int]:
    """Samples per hot-path stage (``STAGES``; ``other`` for the rest: event loop, idle threads)."""
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        frames = [_name(f) for f in stack.split(";")]
        frames = [f for f in frames if "(" in f] or ["(no Python frame)"]
        stage = next((s for s, pats in STAGES if any(p in f for f in frames for p in pats)), "other")
        counts[stage] += int(count_s)
    return dict(counts.most_common())


def per_event_us(counts: dict[str, int], loop_cpu_s: float, events: int) -> dict[str, float]:
    """Spread the event loop's measured CPU (``bench.hotpath``'s main-thread CPU of the drain) over
    the stages that run on it, by their share of its samples; set-up and the commit threads are left
    out (the commit's CPU is measured apart, as the process's CPU less the event loop's)."""
    work = {s: n for s, n in counts.items() if s not in ("setup", COMMIT_STAGE)}
    total = sum(work.values())
    return {s: round(n / total * loop_cpu_s / events * 1e6, 1) for s, n in work.items()} if total else {}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        description="Summarise a py-spy raw profile: top functions, or µs per event per hot-path stage.",
        epilog="example: python -m bench.profiling hot.txt --stages --cpu-s 2.4 --events 50000",
    )
    ap.add_argument("profile", type=Path, help="py-spy --format raw output")
    ap.add_argument("--stages", action="store_true", help="split the samples by hot-path stage")
    ap.add_argument(
        "--cpu-s", type=float, default=0.0, help="the drain's event-loop (main-thread) CPU seconds (bench.hotpath)"
    )
    ap.add_argument("--events", type=int, default=0, help="records drained (bench.hotpath)")
    args = ap.parse_args(argv)
    if not args.stages:
        s = summarize(args.profile)
        for f, pct in s["self_pct"]:
            print(f"{pct:5.1f}%  {f}")
        return 0
    counts = stages(args.profile)
    us = per_event_us(counts, args.cpu_s, args.events) if args.cpu_s and args.events else {}
    work = sum(n for s, n in counts.items() if s != "setup")
    print(f"{'stage':45s} {'samples':>7s} {'share':>7s}  (share of the samples outside set-up)")
    for stage, n in counts.items():
        share = "" if stage == "setup" else f"{100 * n / work:5.1f}%"
        print(f"{stage:45s} {n:7d} {share:>7s} " + (f"{us[stage]:7.1f} µs/event" if stage in us else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
