"""The ApplyChanges saga's decisions (pure): validation and compensating events.

Steps: ``validate`` (event contract + the world's registered schema) → ``publish`` (to the change
topics, in order) → ``wait`` (until every event is in the branch's log) → done. On a failure or
timeout after something was published, ``compensate`` publishes, in reverse order, one event per
published event that undoes it. A compensating event names the event it undoes as its
``caused_by``, so the causal gate applies it only after that event: if the original never lands,
its compensation never applies either (it dead-letters on the causal timeout instead).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from models.events import ChangeEvent, ChangeType, EntityKind, decode
from models.schema import TypeSchema

STEPS = ("validate", "publish", "wait", "compensate")
MAX_EVENTS = 1000


class SagaRefused(ValueError):
    """The request cannot start: ``reasons`` lists each bad event (index, reason, detail)."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons[:20]) + (f" (+{len(reasons) - 20} more)" if len(reasons) > 20 else ""))
        self.reasons = reasons


def check_schema(event: ChangeEvent, schema: TypeSchema | None) -> str | None:
    """Why ``event`` does not fit its type's registered schema, or None (no schema registered: accepted)."""
    if schema is None:
        return None
    known = {p.name.lower() for p in schema.properties if not p.deprecated}
    for props in (event.after, event.before):
        for name in props or {}:
            if name.lower() not in known:
                kind = event.kind.value
                return f"property {name!r} is not in the registered schema of {kind} type {event.entity_type!r}"
    return None


def validate_events(
    world: str,
    raw: Sequence[str],
    schemas: Mapping[tuple[EntityKind, str], TypeSchema],
    max_bytes: int,
) -> list[ChangeEvent]:
    """Decode every event; all must be valid, of ``world``, compensable and fit the schema (else SagaRefused)."""
    if not raw:
        raise SagaRefused(["no events given"])
    if len(raw) > MAX_EVENTS:
        raise SagaRefused([f"{len(raw)} events; at most {MAX_EVENTS} per call"])
    out: list[ChangeEvent] = []
    reasons: list[str] = []
    seen: set[str] = set()
    for i, text in enumerate(raw):
        got = decode(text.encode(), max_bytes=max_bytes)
        if not isinstance(got, ChangeEvent):
            reasons.append(f"event {i}: {got.reason}: {got.detail}")
            continue
        problem = None
        if got.world_id != world:
            problem = f"world_id {got.world_id!r} is not the request's world {world!r}"
        elif got.event_id in seen:
            problem = f"event_id {got.event_id!r} appears twice"
        elif got.change_type is ChangeType.TRUNCATE:
            problem = "TRUNCATE cannot be compensated; send it through the change topics"
        elif got.change_type in (ChangeType.UPDATE, ChangeType.DELETE) and got.before is None:
            problem = f"{got.change_type.value} needs before_properties (its compensation restores them)"
        else:
            problem = check_schema(got, schemas.get((got.kind, got.entity_type)))
        if problem:
            reasons.append(f"event {i} ({got.event_id}): {problem}")
        seen.add(got.event_id)
        out.append(got)
    if reasons:
        raise SagaRefused(reasons)
    return out


def undo_id(event_id: str) -> str:
    """A deterministic id for the compensation of ``event_id`` (a retried saga publishes the same one)."""
    return "undo-" + hashlib.sha256(event_id.encode()).hexdigest()[:40]


def compensation(event: ChangeEvent, now_ms: int | None = None) -> ChangeEvent:
    """The event that undoes ``event``: CREATE → DELETE, UPDATE/SNAPSHOT → restore ``before``, DELETE → CREATE."""
    if event.change_type is ChangeType.CREATE or (event.change_type is ChangeType.SNAPSHOT and event.before is None):
        change, before, after = ChangeType.DELETE, event.after, None
    elif event.change_type is ChangeType.DELETE:
        change, before, after = ChangeType.CREATE, None, event.before
    else:
        change, before, after = ChangeType.UPDATE, event.after, event.before
    return ChangeEvent(
        event_id=undo_id(event.event_id),
        world_id=event.world_id,
        kind=event.kind,
        entity_type=event.entity_type,
        entity_pk=event.entity_pk,
        change_type=change,
        version=event.version + 1,
        before=before,
        after=after,
        caused_by=event.event_id,
        causal_order=None,
        occurred_at_ms=now_ms if now_ms is not None else int(time.time() * 1000),
        schema_version=event.schema_version,
        source="causeway-api-saga-compensation",
        from_pk=event.from_pk,
        to_pk=event.to_pk,
    )


def compensations(published: Sequence[ChangeEvent], now_ms: int | None = None) -> list[ChangeEvent]:
    """Compensating events for ``published``, newest first (reverse order)."""
    return [compensation(e, now_ms) for e in reversed(published)]


@dataclass(frozen=True)
class SagaOutcome:
    status: str  # committed | compensated | failed
    commit_hash: str = ""
    failed_step: str = ""
    message: str = ""
    compensated: int = 0

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = orjson.loads(orjson.dumps(self.__dict__))
        return doc
