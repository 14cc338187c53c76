"""Arrow rows for the three tables, built from change events (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson
import pyarrow as pa

from models.events import ChangeEvent, ChangeType
from sinks.offsets import TopicPartition
from sinks.tables import EDGE, EVENTS, TableDef


@dataclass(frozen=True)
class Source:
    """Where an event was read: its Kafka topic, partition and offset."""

    topic: str
    partition: int
    offset: int

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


def _json(value: object) -> str | None:
    return None if value is None else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _timestamps(ms: list[int]) -> pa.Array:
    # Building from epoch-ms integers is much faster than from datetime objects.
    return pa.array(ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))


def _repeat(value: object, n: int, typ: pa.DataType) -> pa.Array:
    return pa.array([value] * n, typ)


def events_arrow(
    items: Sequence[tuple[ChangeEvent, Source | None]], batch_id: str, now: datetime, stale: set[str]
) -> pa.Table:
    """Rows of ``entity_events`` for the batch."""
    evs = [ev for ev, _ in items]
    srcs = [src for _, src in items]
    n = len(evs)
    schema = EVENTS.arrow_schema
    cols: dict[str, object] = {
        "event_id": [e.event_id for e in evs],
        "world_id": [e.world_id for e in evs],
        "kind": [e.kind.value for e in evs],
        "entity_type": [e.entity_type for e in evs],
        "entity_pk": [e.entity_pk for e in evs],
        "change_type": [e.change_type.value for e in evs],
        "version": [e.version for e in evs],
        "before_properties": [_json(e.before) for e in evs],
        "after_properties": [_json(e.after) for e in evs],
        "caused_by": [e.caused_by for e in evs],
        "causal_order": [e.causal_order for e in evs],
        "occurred_at": _timestamps([e.occurred_at_ms for e in evs]),
        "committed_at": _repeat(now, n, schema.field("committed_at").type),
        "batch_id": _repeat(batch_id, n, schema.field("batch_id").type),
        "schema_version": [e.schema_version for e in evs],
        "source": [e.source for e in evs],
        "from_pk": [e.from_pk for e in evs],
        "to_pk": [e.to_pk for e in evs],
        "source_topic": [s.topic if s else None for s in srcs],
        "source_partition": [s.partition if s else None for s in srcs],
        "source_offset": [s.offset if s else None for s in srcs],
        "applied": [e.event_id not in stale for e in evs],
    }
    return pa.table(cols, schema=schema)


def projection_arrow(tdef: TableDef, events: list[ChangeEvent], batch_id: str, now: datetime) -> pa.Table:
    """The rows a plan writes: one per key, a tombstone for a DELETE."""
    type_col, pk_col = tdef.key
    schema = tdef.arrow_schema
    n = len(events)
    deleted = [e.change_type is ChangeType.DELETE for e in events]
    cols: dict[str, object] = {
        type_col: [e.entity_type for e in events],
        pk_col: [e.entity_pk for e in events],
        "version": [e.version for e in events],
        "properties": [None if d else _json(e.after) for e, d in zip(events, deleted, strict=True)],
        "deleted": deleted,
        "updated_at": _timestamps([e.occurred_at_ms for e in events]),
        "committed_at": _repeat(now, n, schema.field("committed_at").type),
        "event_id": [e.event_id for e in events],
        "batch_id": _repeat(batch_id, n, schema.field("batch_id").type),
        "schema_version": [e.schema_version for e in events],
    }
    if tdef is EDGE:
        cols["from_pk"] = [e.from_pk for e in events]
        cols["to_pk"] = [e.to_pk for e in events]
    return pa.table(cols, schema=schema)
