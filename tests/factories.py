"""Builders for the records tests need: one place that knows every field of a change event.

A test says only what matters to it (``change_event("e1", pk="p1", version=2)``); every other field
gets a plain default. Test modules import from here (or from other helper modules), never from
another test module.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from agents.offset_tracker import Arrival
from models.events import ChangeEvent, ChangeType, EntityKind
from models.schema import validate_change
from sinks.committed_offsets import Source

_UNSET: Any = object()


def change_event(
    event_id: str | None = None,
    *,
    world: str = "w1",
    pk: str = "p1",
    change: ChangeType | str = ChangeType.UPDATE,
    version: int = 1,
    entity_type: str = "T",
    kind: EntityKind = EntityKind.OBJECT,
    after: dict[str, Any] | None = _UNSET,
    before: dict[str, Any] | None = None,
    caused_by: str | None = None,
    causal_order: int | None = None,
    occurred_at_ms: int = 0,
    schema_version: int = 0,
    source: str = "test",
    from_pk: str | None = None,
    to_pk: str | None = None,
    unchanged: tuple[str, ...] = (),
) -> ChangeEvent:
    """A valid ``ChangeEvent``.

    ``event_id`` None: a fresh unique id. A TRUNCATE's key is ``"*"`` (as ``models.events.decode``
    makes it), whatever ``pk`` says. ``after`` left out: None for a DELETE or TRUNCATE, else ``{}``;
    given, it is used as it is (a test may build a DELETE that carries properties on purpose).
    """
    change_type = ChangeType(change)
    if after is _UNSET:
        after = None if change_type in (ChangeType.DELETE, ChangeType.TRUNCATE) else {}
    return ChangeEvent(
        event_id=event_id if event_id is not None else f"ev-{uuid.uuid4().hex[:12]}",
        world_id=world,
        kind=kind,
        entity_type=entity_type,
        entity_pk="*" if change_type is ChangeType.TRUNCATE else pk,
        change_type=change_type,
        version=version,
        before=before,
        after=after,
        caused_by=caused_by,
        causal_order=causal_order,
        occurred_at_ms=occurred_at_ms,
        schema_version=schema_version,
        source=source,
        from_pk=from_pk,
        to_pk=to_pk,
        unchanged=unchanged,
    )


def link_event(
    event_id: str | None = None,
    *,
    frm: str,
    to: str,
    link_type: str = "knows",
    **kw: Any,
) -> ChangeEvent:
    """A link's change event (``link_type`` is its entity type, ``pk`` its link pk)."""
    return change_event(event_id, kind=EntityKind.LINK, entity_type=link_type, from_pk=frm, to_pk=to, **kw)


def arrival(event: ChangeEvent, topic: str = "onto.changes.objects", partition: int = 0, offset: int = 0) -> Arrival:
    """``event`` as the applier sees it: read from ``topic``/``partition`` at ``offset``."""
    return Arrival(event, Source(topic, partition, offset))


def schema_change(world: str, version: int, *ops: dict[str, object], type_name: str = "Equipment") -> bytes:
    """A well-formed schema-change message (``models.schema``) adding ``ops`` to ``type_name``."""
    doc = {
        "change_id": f"{world}-v{version}-{uuid.uuid4().hex[:4]}",
        "world_id": world,
        "kind": "object",
        "type_name": type_name,
        "version": version,
        "occurred_at": int(time.time() * 1000),
        "changes": list(ops),
    }
    validate_change(doc)  # tests send only well-formed changes
    return orjson.dumps(doc)
