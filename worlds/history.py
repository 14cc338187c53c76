"""A world's history as typed records (pure): the Nessie log filter, per-commit kinds and counts.

Counts come from commit properties (events of a batch) and from Iceberg snapshot summaries (rows
a commit added to and removed from each table), never from a table scan. A projection row that
changed counts once as added (its new version) and once as removed (the old version, masked by a
position delete), so ``entity_common +3 -1`` is, e.g., two objects created and one updated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

PROP_BATCH = "causeway.batch_id"
PROP_COUNT = "causeway.event_count"
PROP_CHANGES = "causeway.changes"  # sinks.committer.PROP_CHANGES: events per kind and change type
PROP_ROLLBACK = "causeway.rollback.to"
PROP_RELEASE = "causeway.release"


@dataclass(frozen=True)
class TableCounts:
    """What one commit did to one table, from its snapshot summaries."""

    added_rows: int = 0
    removed_rows: int = 0
    added_files: int = 0
    removed_files: int = 0

    def __add__(self, other: TableCounts) -> TableCounts:
        return TableCounts(
            self.added_rows + other.added_rows,
            self.removed_rows + other.removed_rows,
            self.added_files + other.added_files,
            self.removed_files + other.removed_files,
        )

    def to_json(self) -> dict[str, int]:
        return {
            "added_rows": self.added_rows,
            "removed_rows": self.removed_rows,
            "added_files": self.added_files,
            "removed_files": self.removed_files,
        }


@dataclass(frozen=True)
class CommitRecord:
    """One commit of a world's branch, newest first in a history page."""

    hash: str
    time: datetime
    author: str
    message: str
    kind: str  # batch | rollback | release | merge | other
    batch_ids: tuple[str, ...]
    event_count: int | None
    properties: Mapping[str, str]
    tables: Mapping[str, TableCounts] = field(default_factory=dict)
    #: ``{"object": {"CREATE": n, ...}, "link": {...}, "stale": {...}}`` from the log rows the commit
    #: appended (only when asked: it reads the commit's new ``entity_events`` files).
    changes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "hash": self.hash,
            "time": self.time.isoformat(),
            "author": self.author,
            "message": self.message,
            "kind": self.kind,
            "batch_ids": list(self.batch_ids),
            "event_count": self.event_count,
            "tables": {name: c.to_json() for name, c in self.tables.items()},
            "changes": {k: dict(v) for k, v in self.changes.items()},
            "properties": dict(self.properties),
        }


def commit_kind(properties: Mapping[str, str], message: str) -> str:
    if PROP_ROLLBACK in properties:
        return "rollback"
    if PROP_RELEASE in properties:
        return "release"
    if "causeway.merge.source" in properties:  # a worlds merge (worlds.merge_read.PROP_MERGE_SOURCE)
        return "merge"
    if PROP_BATCH in properties:
        return "batch"
    if message.lower().startswith("merge"):
        return "merge"
    return "other"


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_time(value: datetime) -> str:
    # Nessie's CEL timestamp() wants RFC 3339 with a zone; commit times carry microseconds.
    return _cel_string(value.astimezone().isoformat(timespec="microseconds"))


def history_filter(
    since: datetime | None = None, until: datetime | None = None, author: str | None = None
) -> str | None:
    """The CEL filter for Nessie's log endpoint, or None when nothing is filtered."""
    parts = []
    if since is not None:
        parts.append(f"timestamp(commit.commitTime) >= timestamp({_cel_time(since)})")
    if until is not None:
        # Commit times are read back truncated to microseconds; the server keeps nanoseconds.
        parts.append(f"timestamp(commit.commitTime) < timestamp({_cel_time(until + timedelta(microseconds=1))})")
    if author is not None:
        parts.append(f"commit.author == {_cel_string(author)}")
    return " && ".join(parts) or None


def counts_from_summary(summary: Mapping[str, Any]) -> TableCounts:
    """Rows and files one Iceberg snapshot added and removed (position deletes count as removed rows)."""

    def n(key: str) -> int:
        try:
            return int(summary.get(key) or 0)
        except (TypeError, ValueError):
            return 0

    return TableCounts(
        added_rows=n("added-records"),
        removed_rows=n("deleted-records") + n("added-position-deletes") - n("removed-position-deletes"),
        added_files=n("added-data-files") + n("added-delete-files"),
        removed_files=n("deleted-data-files") + n("removed-delete-files"),
    )


def new_snapshot_counts(
    metadata: Mapping[str, Any], new_id: int | None, old_id: int | None, old_sequence: int | None = None
) -> TableCounts:
    """Sum the summaries of the snapshots a commit added (raw metadata JSON of the commit's version).

    Walks ``parent-snapshot-id`` from ``new_id`` back to ``old_id`` (the previous version's current
    snapshot), counting only snapshots newer than ``old_sequence``: a commit that left the snapshot
    as it was (a schema change) or went back to an older one (a rollback) adds nothing.
    """
    if new_id is None or new_id == old_id or new_id < 0:
        return TableCounts()
    by_id = {s["snapshot-id"]: s for s in metadata.get("snapshots") or ()}
    total = TableCounts()
    current: int | None = new_id
    for _ in range(len(by_id) + 1):
        snap = by_id.get(current) if current is not None else None
        if snap is None or current == old_id:
            break
        if old_sequence is not None and int(snap.get("sequence-number") or 0) <= old_sequence:
            break
        total = total + counts_from_summary(snap.get("summary") or {})
        current = snap.get("parent-snapshot-id")
    return total


def snapshot_sequence(metadata: Mapping[str, Any], snapshot_id: int | None) -> int | None:
    """The sequence number of one snapshot of a metadata file, if it holds it."""
    for snap in metadata.get("snapshots") or ():
        if snap.get("snapshot-id") == snapshot_id:
            return int(snap.get("sequence-number") or 0)
    return None


def previous_metadata_location(metadata: Mapping[str, Any]) -> str | None:
    """The metadata file this one was written over (last entry of ``metadata-log``), if any."""
    log = metadata.get("metadata-log") or ()
    return log[-1].get("metadata-file") if log else None


def change_counts(kinds: list[str], change_types: list[str], applied: list[bool]) -> dict[str, dict[str, int]]:
    """Events a commit appended, per kind and change type; events the version rule refused count as stale."""
    out: dict[str, dict[str, int]] = {}
    for kind, change, ok in zip(kinds, change_types, applied, strict=True):
        per = out.setdefault(kind if ok else "stale", {})
        per[change] = per.get(change, 0) + 1
    return out


def changes_from_properties(properties: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Events per kind and change type recorded by the committer; empty for commits made before it did."""
    raw = properties.get(PROP_CHANGES)
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {
        str(kind): {str(c): int(n) for c, n in per.items() if isinstance(n, int)}
        for kind, per in doc.items()
        if isinstance(per, dict)
    }


def record(
    hash: str,
    time: datetime,
    author: str,
    message: str,
    properties: Mapping[str, str],
    tables: Mapping[str, TableCounts] | None = None,
    changes: Mapping[str, Mapping[str, int]] | None = None,
) -> CommitRecord:
    batch = properties.get(PROP_BATCH)
    count = properties.get(PROP_COUNT)
    if not changes:
        changes = changes_from_properties(properties)
    return CommitRecord(
        hash=hash,
        time=time,
        author=author,
        message=message,
        kind=commit_kind(properties, message),
        batch_ids=tuple(b for b in (batch or "").split(",") if b),
        event_count=int(count) if count and count.isdigit() else None,
        properties=dict(properties),
        tables=dict(tables or {}),
        changes=dict(changes or {}),
    )
