"""An entity's audit trail (pure): its rows of ``entity_events`` folded into ordered entries.

The rows come from a scan of the log filtered on (kind, type, pk) and pushed down to the files;
this module orders them, attaches each one's commit (by batch id) and its ``caused_by`` chain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

AUDIT_COLUMNS = (
    "event_id",
    "kind",
    "entity_type",
    "entity_pk",
    "change_type",
    "version",
    "before_properties",
    "after_properties",
    "caused_by",
    "occurred_at",
    "committed_at",
    "batch_id",
    "source",
    "from_pk",
    "to_pk",
    "applied",
)


@dataclass(frozen=True)
class AuditEntry:
    """One change of one entity, as the world applied (or refused as stale) it."""

    event_id: str
    change_type: str
    version: int
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    applied: bool
    caused_by: tuple[str, ...]  # the cause, its cause, ... as far as the log holds them
    occurred_at: datetime
    committed_at: datetime
    batch_id: str
    commit_hash: str | None
    source: str | None
    from_pk: str | None = None
    to_pk: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "change_type": self.change_type,
            "version": self.version,
            "before": self.before,
            "after": self.after,
            "applied": self.applied,
            "caused_by": list(self.caused_by),
            "occurred_at": self.occurred_at.isoformat(),
            "committed_at": self.committed_at.isoformat(),
            "batch_id": self.batch_id,
            "commit": self.commit_hash,
            "source": self.source,
            "from_pk": self.from_pk,
            "to_pk": self.to_pk,
        }


def _props(text: str | None) -> dict[str, Any] | None:
    return orjson.loads(text) if text else None


def cause_chain(event_id: str, causes: Mapping[str, str | None], max_depth: int = 16) -> tuple[str, ...]:
    """``event_id``'s causes, nearest first, following ``causes`` (event id → caused_by) without loops."""
    chain: list[str] = []
    current = causes.get(event_id)
    while current and current not in chain and len(chain) < max_depth:
        chain.append(current)
        current = causes.get(current)
    return tuple(chain)


def fold(
    rows: Iterable[Mapping[str, Any]], causes: Mapping[str, str | None], commits: Mapping[str, str]
) -> list[AuditEntry]:
    """Entries in the order the world took them: commit time, then the log's order inside a batch.

    Inside one batch the order is the log's ``batch_seq`` (the rows of a flush are sorted by entity in
    the files), or the file order for logs written before it existed; so a stale older version that
    arrived after a newer one stays after it.

    ``causes`` maps event ids (the entity's and their causes') to their ``caused_by``; ``commits``
    maps batch ids to commit hashes.
    """
    indexed = sorted(enumerate(rows), key=lambda ir: (ir[1]["committed_at"], ir[1].get("batch_seq") or 0, ir[0]))
    out = []
    for _, r in indexed:
        chain = cause_chain(r["event_id"], {**causes, r["event_id"]: r.get("caused_by")})
        out.append(
            AuditEntry(
                event_id=r["event_id"],
                change_type=r["change_type"],
                version=r["version"],
                before=_props(r.get("before_properties")),
                after=_props(r.get("after_properties")),
                applied=bool(r.get("applied", True)),
                caused_by=chain,
                occurred_at=r["occurred_at"],
                committed_at=r["committed_at"],
                batch_id=r["batch_id"],
                commit_hash=commits.get(r["batch_id"]),
                source=r.get("source"),
                from_pk=r.get("from_pk"),
                to_pk=r.get("to_pk"),
            )
        )
    return out


def missing_causes(known: Mapping[str, str | None]) -> set[str]:
    """Causes named in ``known`` whose own rows were not read yet (the next lookup round)."""
    return {c for c in known.values() if c and c not in known}
