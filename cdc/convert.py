"""CDC conversion (pure): one raw Debezium record → change events, an ``Ignored`` or a ``Rejected``.

``convert`` turns one raw record (value bytes + its Kafka position) into change events ready to produce,
an ``Ignored`` (a record that is not a row change, or an unmapped table under the ``skip`` policy) or a
``Rejected`` with a dead-letter reason. It does no I/O and reads no clock: the same record always gives
byte-identical output, so a redelivered CDC record produces the same ``event_id`` and dedupes downstream.

Rules (documented in docs/cdc.md):

* ``object_pk`` / ``link_pk`` / ``from_pk`` / ``to_pk``: one column → its value as text; several →
  values joined with ``|`` after escaping ``\\`` as ``\\\\`` and ``|`` as ``\\|``. Text of a value: strings
  as they are (decoded logical types: see cdc.debezium), integers in decimal, booleans
  ``true``/``false``, anything else as compact JSON.
* ``version``: Postgres ``source.lsn``; MySQL/MariaDB ``binlog index × 2^40 + pos``; Oracle ``scn``;
  SQL Server ``change_lsn`` as one integer; otherwise time-based: the source time in microseconds
  (``ts_us``, ``ts_ns/1000`` or ``ts_ms×1000``) × 4096 + Kafka offset mod 4096, which is only as
  monotone as the source clock.
* ``event_id``: ``cdc-`` + 32 hex chars of SHA-256 over connector, logical name, db, schema, table,
  source position (LSN / binlog file:pos:row / SCN / SQL Server commit+change LSN+serial; or the
  Kafka topic:partition:offset when the source has none), op, world, type and pk.
* ``occurred_at``: ``source.ts_ms`` (the commit time), else the envelope's ``ts_ms``.
* A truncate (op ``t``) becomes one TRUNCATE event per world and type, pk ``*``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.debezium import Envelope, EnvelopeError, Op, Skipped, SourceInfo, loads
from cdc.mapping import CdcMapping, TableMapping
from models.events import ChangeEvent, ChangeType, EntityKind, Invalid, decode
from models.worlds import InvalidWorldId, validate_world_id

TRUNCATE_PK = "*"

_OP_CHANGE = {
    Op.CREATE: ChangeType.CREATE,
    Op.UPDATE: ChangeType.UPDATE,
    Op.DELETE: ChangeType.DELETE,
    Op.READ: ChangeType.SNAPSHOT,
    Op.TRUNCATE: ChangeType.TRUNCATE,
}


@dataclass(frozen=True, slots=True)
class Position:
    """Where a raw record was read: the dead-letter origin and the last-resort event-id position."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class CdcEvent:
    """A change event ready to produce: the typed event and its exact wire bytes.

    ``unchanged`` names properties the source did not send (TOAST); they are on the wire as
    ``unchanged_properties`` and the applier must keep their stored values.
    """

    event: ChangeEvent
    unchanged: tuple[str, ...]
    value: bytes

    @property
    def key(self) -> bytes:
        return self.event.key.encode()


@dataclass(frozen=True, slots=True)
class Converted:
    """The events of one row change.

    ``world_unchecked`` names the table (``tables[i]``) when the record is an update of a table whose
    world is a column and the before image lacks that column (Postgres REPLICA IDENTITY DEFAULT):
    a row that moved to another world cannot be seen, so it would stay live in the old one.
    """

    events: tuple[CdcEvent, ...]
    world_unchecked: str | None = None


@dataclass(frozen=True, slots=True)
class Ignored:
    """Not a row change (tombstone, heartbeat, schema change, ...) or unmapped under ``skip``."""

    kind: str


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str
    detail: str
    world_id: str | None = None
    event_id: str | None = None


Result = Converted | Ignored | Rejected


class _Reject(Exception):
    def __init__(self, reason: str, detail: str, world_id: str | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.world_id = world_id


def convert(value: bytes | None, mapping: CdcMapping, position: Position, max_bytes: int = 1_048_576) -> Result:
    """One raw CDC record → events, ignored, or rejected with a reason. Never raises on bad input."""
    try:
        parsed = loads(value, max_bytes)
    except EnvelopeError as exc:
        return Rejected(exc.reason, exc.detail)
    if isinstance(parsed, Skipped):
        return Ignored(parsed.kind.value)
    return convert_envelope(parsed, mapping, position, max_bytes)


def convert_envelope(env: Envelope, mapping: CdcMapping, position: Position, max_bytes: int = 1_048_576) -> Result:
    table = mapping.lookup(position.topic, env.source)
    if table is None:
        if mapping.unmapped == "skip":
            return Ignored("unmapped")
        return Rejected(
            "unmapped-table",
            f"no mapping for topic {position.topic!r} or source table {env.source.qualified_table!r}",
        )
    try:
        drafts = _drafts(env, table, mapping, position)
        unchecked = None
        if env.op is Op.UPDATE and table.world_column is not None:
            before = env.before_raw or {}
            if before.get(table.world_column) is None:
                unchecked = table.label
        return Converted(tuple(_finish(d, max_bytes) for d in drafts), unchecked)
    except EnvelopeError as exc:
        return Rejected(exc.reason, exc.detail)
    except _Reject as rej:
        return Rejected(rej.reason, rej.detail, rej.world_id)


_SQLSERVER_LSN = re.compile(r"([0-9a-fA-F]{8}):([0-9a-fA-F]{8}):([0-9a-fA-F]{4})")
_TIE_BITS = 12  # time-based versions: low bits from the Kafka offset break ties within a microsecond


def source_version(src: SourceInfo, offset: int = 0) -> tuple[int | None, str | None]:
    """(version, position text) from the source block.

    Without a source position the version is time-based, ``source µs × 4096 + offset mod 4096``
    (the same entity is on one partition, keyed by its source pk, so later records have larger
    offsets), and the position text is None: the caller uses the Kafka position for the event id.
    """
    if src.lsn is not None:
        return src.lsn, f"lsn:{src.lsn}"
    if src.binlog_file and src.binlog_pos is not None:
        digits = re.search(r"(\d+)$", src.binlog_file)
        if digits and src.binlog_pos < 2**40 and int(digits.group(1)) < 2**22:
            version = (int(digits.group(1)) << 40) | src.binlog_pos
            return version, f"binlog:{src.binlog_file}:{src.binlog_pos}:{src.binlog_row or 0}"
    if src.scn is not None:
        return src.scn, f"scn:{src.scn}"
    if src.change_lsn:
        m = _SQLSERVER_LSN.fullmatch(src.change_lsn)
        if m:
            lsn = (int(m.group(1), 16) << 48) | (int(m.group(2), 16) << 16) | int(m.group(3), 16)
            position = f"sqlserver:{src.commit_lsn or ''}:{src.change_lsn}:{src.event_serial_no or 0}"
            if lsn < 2**63:
                return lsn, position
    micros = src.ts_us
    if micros is None and src.ts_ns is not None:
        micros = src.ts_ns // 1000
    if micros is None and src.ts_ms is not None:
        micros = src.ts_ms * 1000
    if micros is None or micros < 0:
        return None, None
    return (micros << _TIE_BITS) | (offset % (1 << _TIE_BITS)), None


def pk_text(value: Any) -> str:
    """The text of one key value (after logical-type decoding)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def join_pk(parts: list[str] | tuple[str, ...]) -> str:
    """One part as it is; several joined with ``|`` after escaping ``\\`` and ``|``."""
    if len(parts) == 1:
        return parts[0]
    return "|".join(p.replace("\\", "\\\\").replace("|", "\\|") for p in parts)


def event_id_for(src: SourceInfo, position: str, op: str, world: str, entity_type: str, pk: str) -> str:
    parts = (
        src.connector,
        src.name,
        src.db,
        src.schema or "",
        src.table,
        position,
        op,
        world,
        entity_type,
        pk,
    )
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
    return "cdc-" + digest[:32]


@dataclass(slots=True)
class _Draft:
    event: ChangeEvent
    unchanged: tuple[str, ...]


def _drafts(env: Envelope, table: TableMapping, mapping: CdcMapping, pos: Position) -> list[_Draft]:
    src = env.source
    version, position = source_version(src, pos.offset)
    occurred = src.ts_ms if src.ts_ms is not None else env.ts_ms
    if occurred is None or version is None:
        raise _Reject("missing-timestamp", "neither source.ts_ms nor ts_ms is set")
    if position is None:
        position = f"kafka:{pos.topic}:{pos.partition}:{pos.offset}"
    source_label = f"debezium:{src.connector}:{src.name}:{src.qualified_table}@{position}"[:200]

    def make(
        change: ChangeType,
        world: str,
        pk: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        ends: tuple[str | None, str | None] = (None, None),
        unchanged: tuple[str, ...] = (),
    ) -> _Draft:
        op_code = {ChangeType.CREATE: "c", ChangeType.DELETE: "d"}.get(change, env.op.value)
        ev = ChangeEvent(
            event_id=event_id_for(src, position, op_code, world, table.entity_type, pk),
            world_id=world,
            kind=table.kind,
            entity_type=table.entity_type,
            entity_pk=pk,
            change_type=change,
            version=version,
            before=before,
            after=after,
            caused_by=None,
            causal_order=None,
            occurred_at_ms=occurred,
            schema_version=table.schema_version,
            source=source_label,
            from_pk=ends[0],
            to_pk=ends[1],
        )
        return _Draft(ev, unchanged)

    if env.op is Op.TRUNCATE:
        worlds = (table.world,) if table.world is not None else table.truncate_worlds
        if not worlds:
            raise _Reject(
                "truncate-world-unknown",
                f"{table.label} takes its world from column {table.world_column!r}; list the worlds a "
                "truncate applies to in truncate_worlds",
            )
        return [make(ChangeType.TRUNCATE, w, TRUNCATE_PK, None, None) for w in worlds if w]

    images = env.images(table.column_types, mapping.placeholder)
    before, after = images.before, images.after
    change = _OP_CHANGE[env.op]
    row = before if env.op is Op.DELETE else after
    assert row is not None  # parse() guarantees the image each op needs
    world = _world(table, row)
    pk = _pk(row, table.pk, "pk")
    ends = _ends(table, row, required=env.op is not Op.DELETE)
    r_before, r_after = _rename(table, before), _rename(table, after)
    unchanged = tuple(table.rename.get(c, c) for c in images.unavailable)

    if env.op is Op.UPDATE and before is not None and all(before.get(c) is not None for c in table.pk):
        old_pk = _pk(before, table.pk, "pk")
        # A before image without the world column (partial replica identity) keeps the new world.
        has_world = table.world_column is None or before.get(table.world_column) is not None
        old_world = _world(table, before) if has_world else world
        if (old_world, old_pk) != (world, pk):
            # The key changed inside one update: the old entity goes, the new one appears.
            old_ends = _ends(table, before, required=False)
            return [
                make(ChangeType.DELETE, old_world, old_pk, r_before, None, old_ends),
                make(ChangeType.CREATE, world, pk, None, r_after, ends, unchanged),
            ]
    if env.op is Op.DELETE:
        return [make(change, world, pk, r_before, None, ends)]
    return [make(change, world, pk, r_before, r_after, ends, unchanged)]


def _world(table: TableMapping, row: dict[str, Any]) -> str:
    if table.world is not None:
        return table.world
    col = table.world_column
    assert col is not None
    if col not in row:
        raise _Reject(
            "missing-world-column",
            f"column {col!r} (the world) is not in the row image; deletes need it in 'before' "
            "(Postgres: REPLICA IDENTITY FULL, or make it part of the key)",
        )
    value = row[col]
    if value is None:
        raise _Reject(
            "null-world",
            f"column {col!r} (the world) is null; a delete's 'before' has it only with Postgres "
            "REPLICA IDENTITY FULL or when it is part of the key",
        )
    try:
        return validate_world_id(pk_text(value))
    except InvalidWorldId as exc:
        raise _Reject("bad-world-id", str(exc)) from None


def _pk(row: dict[str, Any], columns: tuple[str, ...], what: str) -> str:
    parts: list[str] = []
    for col in columns:
        if col not in row:
            raise _Reject(
                f"missing-{what}-column",
                f"{what} column {col!r} is not in the row image (has: {', '.join(list(row)[:20])})",
            )
        value = row[col]
        if value is None:
            raise _Reject(f"null-{what}", f"{what} column {col!r} is null")
        parts.append(pk_text(value))
    return join_pk(parts)


def _ends(table: TableMapping, row: dict[str, Any], required: bool) -> tuple[str | None, str | None]:
    if table.kind is not EntityKind.LINK:
        return None, None
    out: list[str | None] = []
    for cols in (table.from_columns, table.to_columns):
        if not required and not all(row.get(c) is not None for c in cols):
            out.append(None)  # a delete's before image may hold the key columns only
            continue
        out.append(_pk(row, cols, "link-end"))
    return out[0], out[1]


def _rename(table: TableMapping, row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None or not table.rename:
        return row
    out: dict[str, Any] = {}
    for col, value in row.items():
        name = table.rename.get(col, col)
        if name in out:
            raise _Reject(
                "rename-collision",
                f"{table.label}.rename gives property {name!r}, which the row already has",
            )
        out[name] = value
    return out


def _finish(draft: _Draft, max_bytes: int) -> CdcEvent:
    """Encode and check the event against the contract the applier enforces."""
    wire = draft.event.to_wire()
    if draft.unchanged:
        wire["unchanged_properties"] = list(draft.unchanged)
    try:
        value = orjson.dumps(wire)
    except orjson.JSONEncodeError as exc:  # e.g. nesting deeper than orjson writes (255 levels)
        raise _Reject("unencodable", f"the mapped event cannot be written as JSON: {exc}") from None
    if len(value) > max_bytes:
        raise _Reject(
            "oversized",
            f"the change event is {len(value)} bytes; the limit is {max_bytes}",
            draft.event.world_id,
        )
    checked = decode(value, draft.event.key.encode(), draft.event.kind, max_bytes)
    if isinstance(checked, Invalid):
        raise _Reject(checked.reason, f"the mapped event breaks the contract: {checked.detail}", draft.event.world_id)
    return CdcEvent(draft.event, draft.unchanged, value)
