"""Crash points for fault-injection tests: ``CAUSEWAY_FAULT=<point>:<n>`` kills the worker with
SIGKILL the n-th time it reaches ``point``. Unset (the default) costs one dict lookup per flush.

Points, in the order of a flush: ``before-commit`` (files may be written, nothing published),
``after-commit`` (the Nessie commit landed, Redis not marked), ``after-mark`` (marked, not acked).
Outside ``POINTS``: ``after-dead-letter`` (the broker confirmed a batch of letters, their decisions
are still pending in Redis).
"""

from __future__ import annotations

import os
import signal

POINTS = ("before-commit", "after-commit", "after-mark")
_spec = os.environ.get("CAUSEWAY_FAULT", "")
_point, _, _count = _spec.partition(":")
_remaining = int(_count or 1) if _point else 0


def reached(point: str) -> None:
    """Kill this process with SIGKILL if the configured fault point is reached for the n-th time."""
    global _remaining
    if not _remaining or point != _point:
        return
    _remaining -= 1
    if _remaining == 0:
        os.kill(os.getpid(), signal.SIGKILL)
