"""A small progress line with rate and ETA for long operator commands (no extra dependency).

On a terminal the line is redrawn in place; otherwise (CI logs, ``tee``) a line is printed at most
every ``every_s`` seconds and once at the end, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def render(label: str, done: int, total: int | None, elapsed_s: float, width: int = 24) -> str:
    """``label [#######-----]  1,200/5,000  24%  812/s  ETA 0:00:05`` (pure, for tests)."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    parts = [label]
    if total:
        frac = min(1.0, done / total)
        filled = int(frac * width)
        parts.append("[" + "#" * filled + "-" * (width - filled) + "]")
        parts.append(f"{done:,}/{total:,}")
        parts.append(f"{frac:4.0%}")
    else:
        parts.append(f"{done:,}")
    parts.append(f"{rate:,.0f}/s")
    if total and rate > 0:
        parts.append("ETA " + _clock(max(0.0, (total - done) / rate)))
    elif total:
        parts.append("ETA --:--")
    return "  ".join(parts)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """``with Progress("replay", total) as p: p.advance(n)``; writes to stderr."""

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        stream: TextIO | None = None,
        every_s: float = 2.0,
        enabled: bool = True,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._start = self._last = time.monotonic()

    def __enter__(self) -> Progress:
        self._start = self._last = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if not self.enabled:
            return
        if self.tty and now - self._last >= 0.1:
            self._last = now
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()
        elif not self.tty and now - self._last >= self.every_s:
            self._last = now
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def line(self) -> str:
        return render(self.label, self.done, self.total, time.monotonic() - self._start)

    def finish(self) -> None:
        if not self.enabled:
            return
        self.stream.write(("\r" if self.tty else "") + self.line() + ("\x1b[K\n" if self.tty else "\n"))
        self.stream.flush()
        self.enabled = False
