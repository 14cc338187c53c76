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
