"""Arrow rows for the three tables, built from change events (pure, no I/O)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

import orjson
import pyarrow as pa

from models.events import ChangeEvent, ChangeType
from models.schema import Primitive, Property, PropType, TypeSchema
from sinks.committed_offsets import Source
from sinks.tables import EDGE, EVENTS, TableDef

#: The log's sort order (see ``sinks.layout.DEFAULT_LAYOUTS``), then its batch order.
EVENTS_SORT = [(c, "ascending") for c in ("entity_type", "entity_pk", "version", "batch_seq")]


def _json(value: object) -> str | None:
    return None if value is None else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _timestamps(ms: list[int]) -> pa.Array:
    # Building from epoch-ms integers is much faster than from datetime objects.
    return pa.array(ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))


def _repeat(value: object, n: int, typ: pa.DataType) -> pa.Array:
    # One scalar repeated: a list of n datetimes cost ~0.4 µs a row to convert (the log's and each
    # projection's ``committed_at``), more than any other column of the log.
    return pa.repeat(pa.scalar(value, typ), n)


def events_arrow(
    items: Sequence[tuple[ChangeEvent, Source | None]],
    batch_id: str,
    now: datetime,
    stale: set[str],
    schema: pa.Schema | None = None,
) -> pa.Table:
    """Rows of ``entity_events`` for the batch, sorted by the log's sort order.

    Rows are sorted by ``(entity_type, entity_pk, version)`` (the table's sort order, so column
    statistics prune an entity's files); ``batch_seq`` keeps the batch's own order for readers
    that fold the log (``committed_at``, then ``batch_seq``). ``schema`` is the table's current
    Arrow schema: a table created before ``batch_seq`` existed (and not evolved since) gets the
    rows without it, unsorted, so its physical order still is the batch order.
    """
    evs = [ev for ev, _ in items]
    srcs = [src for _, src in items]
    n = len(evs)
    full = EVENTS.arrow_schema
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
        "committed_at": _repeat(now, n, full.field("committed_at").type),
        "batch_id": _repeat(batch_id, n, full.field("batch_id").type),
        "schema_version": [e.schema_version for e in evs],
        "source": [e.source for e in evs],
        "from_pk": [e.from_pk for e in evs],
        "to_pk": [e.to_pk for e in evs],
        "source_topic": [s.topic if s else None for s in srcs],
        "source_partition": [s.partition if s else None for s in srcs],
        "source_offset": [s.offset if s else None for s in srcs],
        "applied": [e.event_id not in stale for e in evs],
        "batch_seq": pa.array(range(n), pa.int32()),
    }
    table = pa.table(cols, schema=full)
    if schema is not None and "batch_seq" not in schema.names:
        return table.select([name for name in schema.names if name in full.names]).cast(schema)
    return table.sort_by(EVENTS_SORT) if n > 1 else table


def projection_arrow(
    tdef: TableDef,
    events: list[ChangeEvent],
    batch_id: str,
    now: datetime,
    schema: pa.Schema | None = None,
    types: Mapping[str, TypeSchema] | None = None,
    unconverted: Counter[str] | None = None,
) -> pa.Table:
    """The rows a plan writes: one per key, a tombstone for a DELETE.

    ``schema`` is the table's *current* Arrow schema (it grows with schema evolution; default: the
    base layout) and ``types`` the applied contracts: every typed column of a known property is
    filled from the event's ``after`` properties (by current name, then by earlier names); the JSON
    ``properties`` column keeps everything, including properties no contract knows yet.
    """
    type_col, pk_col = tdef.key
    schema = schema if schema is not None else tdef.arrow_schema
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
    cols.update(typed_columns(schema, types or {}, events, deleted, unconverted))
    for name in schema.names:  # typed columns of properties no event here carries
        if name not in cols:
            cols[name] = pa.nulls(n, schema.field(name).type)
    return pa.table(cols, schema=schema)


class PropertySource(Protocol):
    """What ``typed_columns`` reads of an event (a ``ChangeEvent``, or a row rebuilt from the log)."""

    @property
    def entity_type(self) -> str: ...

    @property
    def after(self) -> Mapping[str, Any] | None: ...


def typed_columns(
    schema: pa.Schema,
    types: Mapping[str, TypeSchema],
    events: Sequence[PropertySource],
    deleted: Sequence[bool],
    unconverted: Counter[str] | None = None,
) -> dict[str, pa.Array]:
    """The typed property columns of ``events`` that exist in ``schema`` (others are left out).

    ``unconverted`` (if given) counts, per column, values present but left null (see ``coerce``).
    """
    present = set(schema.names)
    wanted: dict[str, list[Any]] = {}
    n = len(events)
    for i, (ev, gone) in enumerate(zip(events, deleted, strict=True)):
        contract = types.get(ev.entity_type)
        if contract is None or gone or not ev.after:
            continue
        for prop in contract.properties:
            col = prop.column(contract.type_name)
            if col not in present:
                continue  # the contract is ahead of the table (never after a schema-sync commit)
            value = property_value(ev.after, prop)
            if value is not None:
                wanted.setdefault(col, [None] * n)[i] = value
            elif unconverted is not None and _carried(ev.after, prop) is not None:
                unconverted[col] += 1
    return {col: pa.array(values, schema.field(col).type) for col, values in wanted.items()}


def property_value(after: Mapping[str, Any], prop: Property) -> Any:
    """The typed value of ``prop`` in an event's properties, or None (absent or not convertible).

    A value that does not convert (a string in an int property, say) stays only in the JSON column;
    the typed column is null for that row.
    """
    return coerce(_carried(after, prop), prop.type)


def _carried(after: Mapping[str, Any], prop: Property) -> Any:
    """The raw value of ``prop`` in the event (current name, then earlier names), or None."""
    for name in (prop.name, *prop.aliases):
        if name in after:
            return after[name]
    return None


def coerce(value: Any, t: PropType) -> Any:
    """``value`` (decoded JSON) as a Python value of type ``t``, or None if it does not convert."""
    if value is None:
        return None
    p = t.primitive
    try:
        if p is Primitive.STRING:
            return value if isinstance(value, str) else None
        if p is Primitive.BOOLEAN:
            return value if isinstance(value, bool) else None
        if isinstance(value, bool):
            return None  # JSON true/false is never a number
        if p in (Primitive.INT, Primitive.LONG):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if not isinstance(value, int):
                return None
            bits = 31 if p is Primitive.INT else 63
            return value if -(2**bits) <= value < 2**bits else None
        if p in (Primitive.FLOAT, Primitive.DOUBLE):
            if not isinstance(value, int | float):
                return None
            f = float(value)
            if p is Primitive.FLOAT and math.isfinite(f) and abs(f) > 3.4028234e38:
                return None
            return f
        if p is Primitive.DECIMAL:
            if not isinstance(value, int | float | str):
                return None
            exact = Decimal(str(value))
            d = exact.quantize(Decimal(1).scaleb(-t.scale))
            if d != exact:
                return None  # more fractional digits than the scale: never round silently
            return d if len(d.as_tuple().digits) <= t.precision else None
        if p is Primitive.DATE:
            return date.fromisoformat(value[:10]) if isinstance(value, str) else None
        if p is Primitive.TIMESTAMPTZ:
            if isinstance(value, int):
                return datetime.fromtimestamp(value / 1000, UTC)
            if isinstance(value, str):
                dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
                return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
            return None
        if p is Primitive.TIMESTAMP:
            # Without a zone: the wall-clock value as written; an instant is taken at UTC.
            if isinstance(value, int):
                return datetime.fromtimestamp(value / 1000, UTC).replace(tzinfo=None)
            if isinstance(value, str):
                dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
                return dt.astimezone(UTC).replace(tzinfo=None) if dt.tzinfo else dt
            return None
    except (ValueError, InvalidOperation, OverflowError, OSError):
        return None
    return None
