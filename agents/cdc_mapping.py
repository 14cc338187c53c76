"""CDC mapping: which source table becomes which world and entity type, and the pure conversion.

The mapping is a YAML or JSON document (``CAUSEWAY_CDC_MAPPING`` = a file path, or the JSON itself),
validated once at start-up; every problem is reported at once with its path (``tables[2].pk: ...``).
See docs/cdc.md for the format and an example.

``convert`` turns one raw record (value bytes + its Kafka position) into change events ready to produce,
an ``Ignored`` (a record that is not a row change, or an unmapped table under the ``skip`` policy) or a
``Rejected`` with a dead-letter reason. It does no I/O and reads no clock: the same record always gives
byte-identical output, so a redelivered CDC record produces the same ``event_id`` and dedupes downstream.

Rules (documented in docs/cdc.md):

* ``object_pk`` / ``link_pk`` / ``from_pk`` / ``to_pk``: one column → its value as text; several →
  values joined with ``|`` after escaping ``\\`` as ``\\\\`` and ``|`` as ``\\|``. Text of a value: strings
  as they are (decoded logical types: see models.debezium), integers in decimal, booleans
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
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml

from models.debezium import (
    UNAVAILABLE_PLACEHOLDER,
    Envelope,
    EnvelopeError,
    Op,
    Skipped,
    SourceInfo,
    check_hint,
    loads,
)
from models.errors import InputError
from models.events import ChangeEvent, ChangeType, EntityKind, Invalid, decode
from models.worlds import InvalidWorldId, validate_world_id

ENV_VAR = "CAUSEWAY_CDC_MAPPING"
TOPIC_PREFIX = "cdc.raw."
TRUNCATE_PK = "*"
UnmappedPolicy = Literal["dlq", "skip"]

_OP_CHANGE = {
    Op.CREATE: ChangeType.CREATE,
    Op.UPDATE: ChangeType.UPDATE,
    Op.DELETE: ChangeType.DELETE,
    Op.READ: ChangeType.SNAPSHOT,
    Op.TRUNCATE: ChangeType.TRUNCATE,
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,199}")
_SOURCE_KEYS = ("connector", "name", "db", "schema", "table")


class MappingError(InputError, ValueError):
    """The mapping config cannot be used; ``problems`` lists every one, each with its path."""

    def __init__(self, problems: list[str], origin: str = "CDC mapping") -> None:
        self.problems = problems
        super().__init__(f"{origin} is invalid:\n  " + "\n  ".join(problems))


@dataclass(frozen=True, slots=True)
class TableMapping:
    """How one source table becomes ontology change events."""

    label: str  # where it was declared, for messages: "tables[3]"
    kind: EntityKind
    entity_type: str
    pk: tuple[str, ...]
    topic: str | None = None
    source: tuple[tuple[str, str], ...] = ()  # (key, value) pairs that must all match source.*
    world: str | None = None  # fixed world, or
    world_column: str | None = None  # world taken from this column
    truncate_worlds: tuple[str, ...] = ()  # worlds a truncate applies to when the world is a column
    from_columns: tuple[str, ...] = ()  # links only
    to_columns: tuple[str, ...] = ()
    rename: Mapping[str, str] = field(default_factory=dict)
    column_types: Mapping[str, str] = field(default_factory=dict)
    schema_version: int = 0

    def matches_source(self, src: SourceInfo) -> bool:
        return bool(self.source) and all(getattr(src, k) == v for k, v in self.source)


@dataclass(frozen=True, slots=True)
class CdcMapping:
    tables: tuple[TableMapping, ...]
    unmapped: UnmappedPolicy = "dlq"
    placeholder: str = UNAVAILABLE_PLACEHOLDER
    by_topic: Mapping[str, TableMapping] = field(default_factory=dict)

    def lookup(self, topic: str, source: SourceInfo) -> TableMapping | None:
        """A topic match wins; else the first ``source`` match in declaration order."""
        hit = self.by_topic.get(topic)
        if hit is not None:
            return hit
        for table in self.tables:
            if table.matches_source(source):
                return table
        return None


# --- loading and validation ----------------------------------------------------------------------


def load_mapping(spec: str | Path | Mapping[str, Any]) -> CdcMapping:
    """A validated mapping from a dict, a YAML/JSON file path, or inline JSON; raises MappingError."""
    origin = "CDC mapping"
    if isinstance(spec, Mapping):
        return parse_mapping(spec, origin)
    text = str(spec).strip()
    if text.startswith("{"):
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise MappingError([f"inline JSON does not parse: {exc}"], origin) from None
        return parse_mapping(doc, origin)
    path = Path(text)
    origin = f"CDC mapping {path}"
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MappingError([f"cannot read the file: {exc}"], origin) from None
    try:
        doc = yaml.safe_load(raw)  # YAML is a superset of JSON: one loader for both
    except yaml.YAMLError as exc:
        raise MappingError([f"does not parse as YAML/JSON: {exc}"], origin) from None
    return parse_mapping(doc, origin)


def mapping_from_env(env: Mapping[str, str] | None = None) -> CdcMapping:
    """The mapping named by ``CAUSEWAY_CDC_MAPPING`` (a file path or inline JSON)."""
    env = os.environ if env is None else env
    spec = env.get(ENV_VAR, "").strip()
    if not spec:
        raise MappingError([f"{ENV_VAR} is not set: give a YAML/JSON file path or inline JSON"])
    return load_mapping(spec)


def parse_mapping(doc: Any, origin: str = "CDC mapping") -> CdcMapping:
    problems: list[str] = []
    if not isinstance(doc, Mapping):
        raise MappingError([f"the top level must be a mapping, got {type(doc).__name__}"], origin)
    for key in doc:
        if key not in ("tables", "unmapped", "unavailable_placeholder"):
            problems.append(f"{key}: unknown key (expected tables, unmapped, unavailable_placeholder)")
    unmapped = doc.get("unmapped", "dlq")
    if unmapped not in ("dlq", "skip"):
        problems.append(f"unmapped: {unmapped!r} must be 'dlq' or 'skip'")
    placeholder = doc.get("unavailable_placeholder", UNAVAILABLE_PLACEHOLDER)
    if not isinstance(placeholder, str) or not placeholder:
        problems.append("unavailable_placeholder: must be a non-empty string")
    raw_tables = doc.get("tables")
    tables: list[TableMapping] = []
    if not isinstance(raw_tables, list) or not raw_tables:
        problems.append("tables: must be a non-empty list of table mappings")
    else:
        for i, raw in enumerate(raw_tables):
            table = _parse_table(raw, f"tables[{i}]", problems)
            if table is not None:
                tables.append(table)
    # Duplicates are looked for in the raw entries, so an entry with another problem is reported too.
    first_label: dict[str, str] = {}
    for i, raw in enumerate(raw_tables if isinstance(raw_tables, list) else ()):
        topic = raw.get("topic") if isinstance(raw, Mapping) else None
        if isinstance(topic, str) and topic:
            if topic in first_label:
                problems.append(f"tables[{i}].topic: {topic!r} is already mapped by {first_label[topic]}")
            else:
                first_label[topic] = f"tables[{i}]"
    by_topic: dict[str, TableMapping] = {}
    seen_sources: dict[tuple[tuple[str, str], ...], str] = {}
    for t in tables:
        if t.topic is not None:
            by_topic.setdefault(t.topic, t)
        if t.source:
            if t.source in seen_sources:
                problems.append(f"{t.label}.source: the same source is already mapped by {seen_sources[t.source]}")
            seen_sources[t.source] = t.label
    if problems:
        raise MappingError(problems, origin)
    return CdcMapping(tuple(tables), unmapped, placeholder, by_topic)


def _columns(raw: Any, path: str, problems: list[str], required: bool = True) -> tuple[str, ...]:
    if raw is None and not required:
        return ()
    cols = [raw] if isinstance(raw, str) else raw
    if not isinstance(cols, list) or not cols or not all(isinstance(c, str) and c for c in cols):
        problems.append(f"{path}: must be a column name or a non-empty list of column names")
        return ()
    if len(set(cols)) != len(cols):
        problems.append(f"{path}: lists a column twice")
    return tuple(cols)


def _type_name(raw: Any, path: str, problems: list[str]) -> str:
    if not isinstance(raw, str) or not _NAME.fullmatch(raw):
        problems.append(f"{path}: {raw!r} must be a type name (letters, digits, _ . -; at most 200)")
        return ""
    return raw


def _parse_table(raw: Any, label: str, problems: list[str]) -> TableMapping | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{label}: must be a mapping")
        return None
    known = {
        "topic", "source", "world", "object_type", "link", "pk", "rename",
        "column_types", "truncate_worlds", "schema_version",
    }  # fmt: skip
    for key in raw:
        if key not in known:
            problems.append(f"{label}.{key}: unknown key (expected one of {', '.join(sorted(known))})")
    start = len(problems)

    topic = raw.get("topic")
    source: tuple[tuple[str, str], ...] = ()
    if topic is not None and (not isinstance(topic, str) or not topic.startswith(TOPIC_PREFIX)):
        problems.append(f"{label}.topic: {topic!r} must be a topic name starting with {TOPIC_PREFIX!r}")
    raw_source = raw.get("source")
    if raw_source is not None:
        if not isinstance(raw_source, Mapping) or not raw_source.get("table"):
            problems.append(f"{label}.source: must be a mapping with at least 'table' ({', '.join(_SOURCE_KEYS)})")
        else:
            for k, v in raw_source.items():
                if k not in _SOURCE_KEYS:
                    problems.append(f"{label}.source.{k}: unknown key (expected {', '.join(_SOURCE_KEYS)})")
                elif not isinstance(v, str) or not v:
                    problems.append(f"{label}.source.{k}: must be a non-empty string")
            source = tuple(sorted((str(k), str(v)) for k, v in raw_source.items()))
    if topic is None and raw_source is None:
        problems.append(f"{label}: needs 'topic' (cdc.raw.<source>.<table>) or 'source' (db/schema/table)")

    world = world_column = None
    raw_world = raw.get("world")
    if isinstance(raw_world, Mapping):
        col = raw_world.get("column")
        if set(raw_world) != {"column"} or not isinstance(col, str) or not col:
            problems.append(f"{label}.world: use a world id, or {{column: <column name>}}")
        else:
            world_column = col
    else:
        try:
            world = validate_world_id(raw_world)
        except InvalidWorldId as exc:
            problems.append(f"{label}.world: {exc} (or use {{column: <column name>}})")
    truncate_worlds: list[str] = []
    for j, w in enumerate(raw.get("truncate_worlds") or []):
        try:
            truncate_worlds.append(validate_world_id(w))
        except InvalidWorldId as exc:
            problems.append(f"{label}.truncate_worlds[{j}]: {exc}")
    if world is not None and raw.get("truncate_worlds"):
        problems.append(f"{label}.truncate_worlds: only for a world taken from a column")

    has_object, has_link = "object_type" in raw, "link" in raw
    kind = EntityKind.OBJECT
    entity_type = ""
    from_cols: tuple[str, ...] = ()
    to_cols: tuple[str, ...] = ()
    if has_object == has_link:
        problems.append(f"{label}: give exactly one of 'object_type' or 'link' ({{type, from, to}})")
    elif has_object:
        entity_type = _type_name(raw["object_type"], f"{label}.object_type", problems)
    else:
        kind = EntityKind.LINK
        link = raw["link"]
        if not isinstance(link, Mapping) or set(link) != {"type", "from", "to"}:
            problems.append(f"{label}.link: must be {{type: <link type>, from: [columns], to: [columns]}}")
        else:
            entity_type = _type_name(link["type"], f"{label}.link.type", problems)
            from_cols = _columns(link["from"], f"{label}.link.from", problems)
            to_cols = _columns(link["to"], f"{label}.link.to", problems)
    pk = _columns(raw.get("pk"), f"{label}.pk", problems)

    rename = raw.get("rename") or {}
    if not isinstance(rename, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in rename.items()
    ):
        problems.append(f"{label}.rename: must map source column names to property names")
        rename = {}
    elif len(set(rename.values())) != len(rename):
        problems.append(f"{label}.rename: two columns are renamed to the same property")
    column_types = raw.get("column_types") or {}
    if not isinstance(column_types, Mapping):
        problems.append(f"{label}.column_types: must map column names to types")
        column_types = {}
    for col, hint in column_types.items():
        why = check_hint(hint) if isinstance(hint, str) else "must be a string"
        if why:
            problems.append(f"{label}.column_types.{col}: {why}")
    schema_version = raw.get("schema_version", 0)
    if isinstance(schema_version, bool) or not isinstance(schema_version, int) or schema_version < 0:
        problems.append(f"{label}.schema_version: must be an integer >= 0")

    if len(problems) > start:
        return None
    return TableMapping(
        label=label,
        kind=kind,
        entity_type=entity_type,
        pk=pk,
        topic=topic,
        source=source,
        world=world,
        world_column=world_column,
        truncate_worlds=tuple(truncate_worlds),
        from_columns=from_cols,
        to_columns=to_cols,
        rename=dict(rename),
        column_types=dict(column_types),
        schema_version=schema_version,
    )


# --- conversion ----------------------------------------------------------------------------------


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
