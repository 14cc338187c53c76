"""Rollback planning (pure): which tables go back to which state, and their new metadata.

A rollback is a *new* commit on the world's branch whose tables equal those at the target commit
(history is kept, nothing is force-reset). What it must not rewind is the applier's bookkeeping:

* the committed-offset summary (``causeway.committed-offsets`` on ``entity_events``) is carried
  over from the head, so events that were consumed before the rollback are not applied again when
  Kafka redelivers them (the committer drops offsets the summary holds);
* Redis marks are not touched;
* the rolled-back events leave the branch's event log (the log stays the truth of what the world
  holds, so a rebuild from it equals the projections), which lets ``replay --into-world`` re-apply
  them on purpose: a replay leaves out only events the target branch's log holds.

The new metadata of a table is the target's, with the head's offset summary, the head's metadata
file appended to the metadata log, and the sequence number never moving backwards.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sinks.tables import OFFSETS_PROPERTY

RESTORE, DROP, CREATE, KEEP = "restore", "drop", "create", "keep"
METADATA_LOG_MAX = 20

PROP_TO = "causeway.rollback.to"
PROP_FROM = "causeway.rollback.from"
PROP_COMMITS = "causeway.rollback.commits"
PROP_BATCHES = "causeway.rollback.batches"


@dataclass(frozen=True)
class TableAction:
    table: str
    action: str  # restore | drop | create | keep
    target_location: str | None
    head_location: str | None


@dataclass(frozen=True)
class RollbackPlan:
    world: str
    branch: str
    head: str
    target: str
    actions: tuple[TableAction, ...]
    rolled_back: tuple[str, ...]  # commit hashes after the target up to the head, newest first
    batch_ids: tuple[str, ...] = field(default=())

    @property
    def noop(self) -> bool:
        return all(a.action == KEEP for a in self.actions)

    def properties(self) -> dict[str, str]:
        """Commit properties recording the rolled-back range (kept short: ids are capped)."""
        props = {
            PROP_TO: self.target,
            PROP_FROM: self.head,
            PROP_COMMITS: str(len(self.rolled_back)),
            "causeway.world": self.world,
        }
        if self.batch_ids:
            shown = list(self.batch_ids[:200])
            props[PROP_BATCHES] = ",".join(shown) + (",..." if len(self.batch_ids) > len(shown) else "")
        return props

    def message(self) -> str:
        return (
            f"rollback world {self.world} to {self.target[:16]} "
            f"({len(self.rolled_back)} commit(s) since, head was {self.head[:16]})"
        )


def plan_actions(
    tables: Sequence[str], target: Mapping[str, str | None], head: Mapping[str, str | None]
) -> tuple[TableAction, ...]:
    """Per table: its metadata location at the target and at the head → what the rollback does."""
    out = []
    for name in tables:
        t, h = target.get(name), head.get(name)
        if t == h:
            action = KEEP
        elif t is None:
            action = DROP
        elif h is None:
            action = CREATE
        else:
            action = RESTORE
        out.append(TableAction(name, action, t, h))
    return tuple(out)


def rolled_range(
    history: Sequence[tuple[str, Mapping[str, str]]], target: str
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Commits newer than ``target`` (newest first) and their batch ids; None if target is not in ``history``."""
    hashes: list[str] = []
    batches: list[str] = []
    for h, props in history:
        if h == target:
            return tuple(hashes), tuple(batches)
        hashes.append(h)
        if "causeway.batch_id" in props:
            batches.append(props["causeway.batch_id"])
    return None


def restored_metadata(
    target: Mapping[str, Any], head: Mapping[str, Any] | None, head_location: str | None, now_ms: int
) -> dict[str, Any]:
    """The target's table metadata made the next version after the head's (raw Iceberg JSON)."""
    out = copy.deepcopy(dict(target))
    out["last-updated-ms"] = max(now_ms, int(out.get("last-updated-ms") or 0))
    if head is None:
        return out
    props = dict(out.get("properties") or {})
    head_props = head.get("properties") or {}
    if OFFSETS_PROPERTY in head_props:
        props[OFFSETS_PROPERTY] = head_props[OFFSETS_PROPERTY]
    out["properties"] = props
    out["last-sequence-number"] = max(
        int(out.get("last-sequence-number") or 0), int(head.get("last-sequence-number") or 0)
    )
    log = list(head.get("metadata-log") or ())
    if head_location:
        log.append({"timestamp-ms": int(head.get("last-updated-ms") or 0), "metadata-file": head_location})
    out["metadata-log"] = log[-METADATA_LOG_MAX:]
    return out
