"""Garbage collection planning (pure): Nessie's mark-and-sweep over the warehouse.

**Mark.** A commit is *live* when it is the head of a branch or tag, when it was made within the
retention (``--older-than``), or when it is the newest commit at or before the retention cutoff
(the state a time-travel read at the cutoff sees). For every table at every live commit, the
table's metadata file, its *current* snapshot's manifest list, manifests and data and delete files
are live. Snapshots that were current at no live commit are expired in Nessie's sense: nothing
live reaches their files any more (a table's metadata may still list them; Nessie time travel goes
through commits, not Iceberg snapshots).

**Sweep.** Every file under the warehouse that is not live and was last modified before the cutoff
(the same grace period, so a file a writer is about to commit is never taken) is deleted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from models.errors import WorldsError

_DURATION = re.compile(r"(\d+)\s*([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class GcError(WorldsError, ValueError):
    """A GC request that cannot be run as asked."""


def parse_duration(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``45s``, ``1w`` or a combination (``1d12h``)."""
    cleaned = text.strip().lower()
    parts = _DURATION.findall(cleaned)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != cleaned.replace(" ", ""):
        raise GcError(f"not a duration: {text!r} (use e.g. 7d, 12h, 30m, 1d12h)")
    return timedelta(seconds=sum(int(n) * _UNIT[u] for n, u in parts))


@dataclass(frozen=True)
class StoredFile:
    path: str
    size: int
    modified: datetime


@dataclass
class SweepPlan:
    delete: list[StoredFile] = field(default_factory=list)
    kept_live: int = 0
    kept_young: int = 0  # not live, but newer than the cutoff: left for a later run

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.delete)

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.delete]


def normalize(path: str) -> str:
    """One spelling per file: ``file:/x``, ``file:///x`` and ``/x`` are the same local file."""
    if path.startswith("file://"):
        return path[len("file://") :]
    if path.startswith("file:"):
        return path[len("file:") :]
    return path


def sweep(files: Iterable[StoredFile], live: set[str], cutoff: datetime) -> SweepPlan:
    """Files to delete: not live (``live`` holds normalized paths) and last modified before ``cutoff``."""
    plan = SweepPlan()
    for f in sorted(files, key=lambda f: f.path):
        if normalize(f.path) in live:
            plan.kept_live += 1
        elif f.modified >= cutoff:
            plan.kept_young += 1
        else:
            plan.delete.append(f)
    return plan
