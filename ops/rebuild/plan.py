"""Rebuilding projections from the event log (pure: rows in, rows and a diff out).

``entity_events`` holds every event a world applied (``applied = true``) or refused as stale. The
projections follow from the applied rows alone: per entity the highest version wins, a DELETE
leaves a tombstone that keeps its version (as the live committer writes it, so a late older event
still cannot resurrect the entity), and a TRUNCATE removes every row of its type committed before
it. Each rebuilt row carries the ``updated_at``, ``committed_at``, ``event_id``, ``batch_id`` and
``schema_version`` of the event that wrote it, so a rebuilt row equals the live one column for
column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str]  # (entity_type, entity_pk)
Row = dict[str, Any]

LOG_COLUMNS = (
    "event_id",
    "kind",
    "entity_type",
    "entity_pk",
    "change_type",
    "version",
    "after_properties",
    "from_pk",
    "to_pk",
    "occurred_at",
    "committed_at",
    "batch_id",
    "schema_version",
    "applied",
    "batch_seq",
)
COMPARED = ("version", "deleted", "properties", "event_id")


@dataclass
class Rebuilt:
    objects: dict[Key, Row] = field(default_factory=dict)
    links: dict[Key, Row] = field(default_factory=dict)
    events_used: int = 0


def fold(log_rows: Iterable[Mapping[str, Any]]) -> Rebuilt:
    """The projections implied by the log's applied rows, processed in commit order."""
    rows = [r for r in log_rows if r.get("applied")]
    # Stable sort: a batch's rows by batch_seq (its order); rows written before that column
    # existed have none and keep their read order, which is their batch's order.
    rows.sort(key=lambda r: (r["committed_at"], r.get("batch_seq") or 0))
    out = Rebuilt(events_used=len(rows))
    for r in rows:
        target = out.objects if r["kind"] == "object" else out.links
        etype, pk = r["entity_type"], r["entity_pk"]
        if r["change_type"] == "TRUNCATE":
            for key in [k for k in target if k[0] == etype]:
                del target[key]
            continue
        key = (etype, pk)
        cur = target.get(key)
        if cur is not None and r["version"] <= cur["version"]:
            continue
        deleted = r["change_type"] == "DELETE"
        row: Row = {
            "version": r["version"],
            "properties": None if deleted else r["after_properties"],
            "deleted": deleted,
            "updated_at": r["occurred_at"],
            "committed_at": r["committed_at"],
            "event_id": r["event_id"],
            "batch_id": r["batch_id"],
            "schema_version": r["schema_version"],
        }
        if r["kind"] == "object":
            row |= {"object_type_id": etype, "object_pk": pk}
        else:
            row |= {"link_type": etype, "link_pk": pk, "from_pk": r["from_pk"], "to_pk": r["to_pk"]}
        target[key] = row
    return out


@dataclass
class TableDiff:
    table: str
    live_rows: int
    rebuilt_rows: int
    same: int = 0
    only_live: list[Key] = field(default_factory=list)
    only_rebuilt: list[Key] = field(default_factory=list)
    changed: list[Key] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not (self.only_live or self.only_rebuilt or self.changed)

    def sample(self, n: int = 10) -> list[str]:
        out = [f"- {k[0]}/{k[1]}" for k in sorted(self.only_live)[:n]]
        out += [f"+ {k[0]}/{k[1]}" for k in sorted(self.only_rebuilt)[: max(0, n - len(out))]]
        out += [f"~ {k[0]}/{k[1]}" for k in sorted(self.changed)[: max(0, n - len(out))]]
        return out


def diff(table: str, live: Mapping[Key, Row], rebuilt: Mapping[Key, Row]) -> TableDiff:
    """Rows only in the live table (-), only rebuilt (+), or different in version/deleted/properties (~)."""
    d = TableDiff(table, len(live), len(rebuilt))
    for key, row in live.items():
        other = rebuilt.get(key)
        if other is None:
            d.only_live.append(key)
        elif any(row.get(c) != other.get(c) for c in COMPARED):
            d.changed.append(key)
        else:
            d.same += 1
    d.only_rebuilt = [k for k in rebuilt if k not in live]
    return d
