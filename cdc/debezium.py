"""Debezium change-event envelopes (JSON): parsing, logical-type decoding, and what we skip.

Accepted shapes (one Kafka record value each):

* the JsonConverter wrapper ``{"schema": {...}, "payload": {...}}`` (``schemas.enable=true``);
* the payload alone (``schemas.enable=false``): ``{"before", "after", "source", "op", "ts_ms"}``.

Ops: ``c`` create, ``u`` update, ``d`` delete, ``r`` snapshot read, ``t`` truncate. Records that are
not row changes are recognised and *skipped* (the caller counts them), never rejected:
tombstones (null value, or a wrapper whose payload is null), heartbeats, schema-change (DDL) records,
transaction BEGIN/END metadata and ``m`` (logical decoding message) records.

Value representation (exact, JSON-serialisable) -- see docs/cdc.md:

=========================================  =========================================================
Debezium / Connect logical type            output
=========================================  =========================================================
connect Decimal (base64 bytes + scale)     decimal string, plain notation, scale kept: ``"12.30"``
io.debezium.data.VariableScaleDecimal      decimal string, the record's own scale
connect Date, io.debezium.time.Date        ``"YYYY-MM-DD"``
connect Time, time.Time/MicroTime/NanoTime ``"HH:MM:SS.ffffff"`` (``24:00:00.000000`` is kept)
connect Timestamp, time.Timestamp,         ``"YYYY-MM-DDTHH:MM:SS.ffffff"``: no zone (a ``timestamp
time.MicroTimestamp/NanoTimestamp          without time zone``), microseconds (ns are truncated);
                                           property type ``timestamp`` (Iceberg ``timestamp``)
io.debezium.time.ZonedTimestamp (string)   the string as Debezium sent it, offset kept (checked);
                                           property type ``timestamptz`` (Iceberg ``timestamptz``)
bytes (no logical name), io.debezium.data  standard base64 string, as Debezium sent it (checked)
.Bits
io.debezium.data.Json                      the parsed JSON value (object, array, ...)
io.debezium.data.Uuid                      lower-case string
float "NaN" / "Infinity" / "-Infinity"     kept as those strings (JSON has no NaN)
timestamps/dates beyond year 1..9999       ``"infinity"`` / ``"-infinity"`` (Postgres infinities)
anything else                              the JSON value unchanged
=========================================  =========================================================

Without a schema (payload-only) values pass through unchanged unless the table's mapping gives
``column_types`` hints (see ``hint_schema``): a base64 Decimal cannot be told from a string, so
connectors without schemas should use ``decimal.handling.mode=string``.

TOAST: Postgres sends ``__debezium_unavailable_value`` (or its base64 bytes, or a one-element list of
it) for an unchanged out-of-line value it did not read. Such a column is *dropped* from the image and
named in ``RowImages.unavailable``: the applier must keep the stored value. A placeholder is never
written as data.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from enum import StrEnum
from typing import Any

import orjson

from models.errors import InputError

UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"

_EPOCH = datetime(1970, 1, 1)  # naive: Debezium's Timestamp types carry no zone
_EPOCH_DATE = date(1970, 1, 1)
_DAY_US = 86_400_000_000


class Op(StrEnum):
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"  # snapshot read
    TRUNCATE = "t"


class SkipKind(StrEnum):
    """Records that carry no row change; counted by kind and acknowledged."""

    TOMBSTONE = "tombstone"
    HEARTBEAT = "heartbeat"
    SCHEMA_CHANGE = "schema-change"
    TRANSACTION = "transaction"
    MESSAGE = "message"


class EnvelopeError(InputError, ValueError):
    """A record that is not a usable Debezium envelope; ``reason`` is a stable dead-letter code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Skipped:
    kind: SkipKind


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """The envelope's ``source`` block: where and when the change happened."""

    connector: str  # postgresql, mysql, sqlserver, oracle, ...
    name: str  # the connector's logical name (topic.prefix)
    db: str
    schema: str | None
    table: str
    ts_ms: int | None
    snapshot: str | None  # "true", "last", "first", "incremental", ... or None / "false"
    lsn: int | None = None  # Postgres
    binlog_file: str | None = None  # MySQL / MariaDB
    binlog_pos: int | None = None
    binlog_row: int | None = None
    scn: int | None = None  # Oracle
    change_lsn: str | None = None  # SQL Server "0000002a:00000758:0005"
    commit_lsn: str | None = None
    event_serial_no: int | None = None
    ts_us: int | None = None
    ts_ns: int | None = None

    @property
    def qualified_table(self) -> str:
        return ".".join(p for p in (self.db, self.schema, self.table) if p)


@dataclass(frozen=True, slots=True)
class Envelope:
    """A parsed row-change envelope; row images are still raw JSON until ``images`` decodes them."""

    op: Op
    source: SourceInfo
    ts_ms: int | None
    before_raw: dict[str, Any] | None
    after_raw: dict[str, Any] | None
    before_schema: dict[str, Any] | None
    after_schema: dict[str, Any] | None
    has_schema: bool

    def images(self, hints: Mapping[str, str] | None = None, placeholder: str = UNAVAILABLE_PLACEHOLDER) -> RowImages:
        """Decode ``before``/``after`` with the schema (or ``hints`` when there is none)."""
        before_schema = self.before_schema
        after_schema = self.after_schema
        if not self.has_schema and hints:
            before_schema = after_schema = hint_schema(hints)
        strict = self.has_schema
        before, _ = decode_row(self.before_raw, before_schema, placeholder, strict, "before")
        after, unavailable = decode_row(self.after_raw, after_schema, placeholder, strict, "after")
        return RowImages(before, after, unavailable)


@dataclass(frozen=True, slots=True)
class RowImages:
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    unavailable: tuple[str, ...]  # columns dropped from ``after``: keep their stored values


# --- parsing -------------------------------------------------------------------------------------


def loads(value: bytes | None, max_bytes: int = 1_048_576) -> Envelope | Skipped:
    """Parse one record value; raises EnvelopeError with a dead-letter reason on bad input."""
    if value is None or value == b"":
        return Skipped(SkipKind.TOMBSTONE)
    if len(value) > max_bytes:
        raise EnvelopeError("oversized", f"value is {len(value)} bytes; the limit is {max_bytes}")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeError("malformed-json", f"value is not valid UTF-8 JSON: {exc}") from None
    return parse(doc)


def parse(doc: Any) -> Envelope | Skipped:
    """Parse an already-decoded JSON document (see ``loads``)."""
    if doc is None:
        return Skipped(SkipKind.TOMBSTONE)
    if not isinstance(doc, dict):
        raise EnvelopeError("not-an-envelope", f"the value must be a JSON object, got {type(doc).__name__}")
    schema: dict[str, Any] | None = None
    payload: Any = doc
    if set(doc) == {"schema", "payload"}:
        schema, payload = doc["schema"], doc["payload"]
        if payload is None:
            return Skipped(SkipKind.TOMBSTONE)
        if schema is not None and not isinstance(schema, dict):
            raise EnvelopeError("bad-schema", "the wrapper's 'schema' must be an object or null")
        if not isinstance(payload, dict):
            raise EnvelopeError("not-an-envelope", "the wrapper's 'payload' must be an object")
    skip = _non_row_kind(payload, schema)
    if skip is not None:
        return Skipped(skip)

    raw_op = payload.get("op")
    if raw_op is None:
        raise EnvelopeError(
            "not-an-envelope",
            "no 'op' field: expected a Debezium envelope (before/after/source/op); "
            "flattened records (ExtractNewRecordState) are not supported",
        )
    if raw_op == "m":
        return Skipped(SkipKind.MESSAGE)
    try:
        op = Op(raw_op)
    except ValueError:
        raise EnvelopeError("unknown-op", f"op {str(raw_op)[:20]!r} is not one of c, u, d, r, t") from None

    source = _source(payload.get("source"))
    before = _image(payload, "before")
    after = _image(payload, "after")
    if op in (Op.CREATE, Op.UPDATE, Op.READ) and after is None:
        raise EnvelopeError("missing-after", f"op '{op.value}' needs an 'after' row image")
    if op is Op.DELETE and before is None:
        raise EnvelopeError(
            "missing-before",
            "a delete needs a 'before' image with the key columns (Postgres: REPLICA IDENTITY "
            "DEFAULT or FULL, not NOTHING)",
        )
    ts_ms = payload.get("ts_ms")
    if ts_ms is not None and not _is_int(ts_ms):
        raise EnvelopeError("bad-envelope", "'ts_ms' must be an integer")

    before_schema = after_schema = None
    if schema is not None:
        fields = _struct_fields(schema, "envelope schema")
        before_schema = fields.get("before")
        after_schema = fields.get("after")
        if "op" not in fields or ("after" not in fields and "before" not in fields):
            raise EnvelopeError(
                "schema-mismatch", "the schema does not describe a Debezium envelope (no op/before/after)"
            )
    return Envelope(op, source, ts_ms, before, after, before_schema, after_schema, schema is not None)


def _non_row_kind(payload: dict[str, Any], schema: dict[str, Any] | None) -> SkipKind | None:
    name = schema.get("name") if schema is not None else None
    if isinstance(name, str):
        if name.endswith("SchemaChangeValue"):
            return SkipKind.SCHEMA_CHANGE
        if name.endswith(".Heartbeat"):
            return SkipKind.HEARTBEAT
        if name.endswith("TransactionMetadataValue"):
            return SkipKind.TRANSACTION
    if "op" in payload:
        return None
    if "ddl" in payload or "tableChanges" in payload:
        return SkipKind.SCHEMA_CHANGE
    if "status" in payload and "id" in payload and payload.get("status") in ("BEGIN", "END"):
        return SkipKind.TRANSACTION
    if set(payload) == {"ts_ms"}:
        return SkipKind.HEARTBEAT
    return None


def _image(payload: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise EnvelopeError("bad-envelope", f"'{name}' must be an object or null, got {type(value).__name__}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_int(block: dict[str, Any], name: str) -> int | None:
    value = block.get(name)
    if value is None:
        return None
    if _is_int(value):
        return int(value)
    if isinstance(value, str) and value.isdigit():  # Oracle sends scn as a string
        return int(value)
    raise EnvelopeError("bad-source", f"source.{name} must be an integer, got {str(value)[:40]!r}")


def _opt_str(block: dict[str, Any], name: str) -> str | None:
    value = block.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _source(block: Any) -> SourceInfo:
    if not isinstance(block, dict):
        raise EnvelopeError("missing-source", "the envelope needs a 'source' object (connector, db, table)")
    table = block.get("table") or block.get("collection")
    if not isinstance(table, str) or not table:
        raise EnvelopeError("missing-source", "source.table is missing")
    return SourceInfo(
        connector=_opt_str(block, "connector") or "",
        name=_opt_str(block, "name") or "",
        db=_opt_str(block, "db") or "",
        schema=_opt_str(block, "schema"),
        table=table,
        ts_ms=_opt_int(block, "ts_ms"),
        snapshot=_opt_str(block, "snapshot"),
        lsn=_opt_int(block, "lsn"),
        binlog_file=_opt_str(block, "file"),
        binlog_pos=_opt_int(block, "pos"),
        binlog_row=_opt_int(block, "row"),
        scn=_opt_int(block, "scn"),
        change_lsn=_opt_str(block, "change_lsn"),
        commit_lsn=_opt_str(block, "commit_lsn"),
        event_serial_no=_opt_int(block, "event_serial_no"),
        ts_us=_opt_int(block, "ts_us"),
        ts_ns=_opt_int(block, "ts_ns"),
    )


def _struct_fields(schema: Any, where: str) -> dict[str, dict[str, Any]]:
    if not isinstance(schema, dict) or schema.get("type") != "struct":
        raise EnvelopeError("schema-mismatch", f"{where} must be a struct schema")
    fields = schema.get("fields")
    if not isinstance(fields, list):
        raise EnvelopeError("schema-mismatch", f"{where} has no 'fields' list")
    out: dict[str, dict[str, Any]] = {}
    for f in fields:
        if not isinstance(f, dict) or not isinstance(f.get("field"), str):
            raise EnvelopeError("schema-mismatch", f"{where} has a field without a name")
        out[f["field"]] = f
    return out


# --- row decoding --------------------------------------------------------------------------------


ValueDecoder = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class RowDecoder:
    """A row schema compiled once: a decoder per declared column (schemas repeat for every record)."""

    columns: Mapping[str, ValueDecoder]
    strict: bool

    def decode(
        self, row: dict[str, Any], placeholder: str | None, where: str, nulls_ok: bool = False
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        columns, strict = self.columns, self.strict
        b64 = _b64(placeholder) if placeholder is not None else None
        out: dict[str, Any] = {}
        unavailable: list[str] = []
        for column, value in row.items():
            if placeholder is not None:
                kind = type(value)
                if (kind is str and (value == placeholder or value == b64)) or (
                    kind is list and len(value) == 1 and value[0] == placeholder
                ):
                    unavailable.append(column)
                    continue
            if value is None and nulls_ok:
                out[column] = None
                continue
            decode = columns.get(column)
            if decode is None:
                if strict:
                    raise EnvelopeError(
                        "schema-mismatch", f"column {column!r} of '{where}' is not declared in the schema"
                    )
                out[column] = value
                continue
            try:
                out[column] = decode(value)
            except EnvelopeError as exc:
                raise EnvelopeError(exc.reason, f"column {column!r} of '{where}': {exc.detail}") from None
        return out, tuple(unavailable)


_NO_SCHEMA = RowDecoder({}, strict=False)
_COMPILED: dict[tuple[Any, ...], tuple[dict[str, Any], RowDecoder]] = {}
_COMPILED_MAX = 1024


def row_decoder(schema: dict[str, Any] | None, strict: bool = True, where: str = "after") -> RowDecoder:
    """The compiled decoder of a row schema, memoised: an equal schema (one dict compare) is a hit."""
    if schema is None:
        return _NO_SCHEMA
    if not isinstance(schema, dict):
        raise EnvelopeError("schema-mismatch", f"schema of '{where}' must be a struct schema")
    fields = schema.get("fields")
    # before and after share a schema apart from "field": keep both
    key = (schema.get("name"), schema.get("field"), strict, len(fields) if isinstance(fields, list) else -1)
    hit = _COMPILED.get(key)
    if hit is not None and hit[0] == schema:
        return hit[1]
    decoder = _compile_row(schema, strict, where)
    if len(_COMPILED) >= _COMPILED_MAX:
        _COMPILED.clear()
    _COMPILED[key] = (schema, decoder)
    return decoder


def _compile_row(schema: dict[str, Any], strict: bool, where: str) -> RowDecoder:
    fields = _struct_fields(schema, f"schema of '{where}'")
    return RowDecoder({name: compile_value(f, strict) for name, f in fields.items()}, strict)


def decode_row(
    row: dict[str, Any] | None,
    schema: dict[str, Any] | None,
    placeholder: str | None = UNAVAILABLE_PLACEHOLDER,
    strict: bool = True,
    where: str = "after",
) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """Decode one row image; returns (columns, unavailable columns dropped from it).

    ``strict`` (a real schema): a column the schema does not declare, a value of the wrong JSON type
    or a null in a required column is a ``schema-mismatch``. Hint schemas are not strict.
    A ``before`` image may hold nulls anywhere: with Postgres ``REPLICA IDENTITY DEFAULT`` only its
    key columns are filled, whatever the schema says about the others.
    """
    if row is None:
        return None, ()
    nulls_ok = where == "before"
    return row_decoder(schema, strict, where).decode(row, placeholder, where, nulls_ok)


@functools.lru_cache(maxsize=8)
def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


_INT_TYPES = frozenset({"int8", "int16", "int32", "int64"})
_FLOAT_TYPES = frozenset({"float32", "float64", "float", "double"})
_FLOAT_WORDS = frozenset({"NaN", "Infinity", "-Infinity"})


def decode_value(value: Any, schema: Mapping[str, Any], strict: bool = True) -> Any:
    """Decode one value by its (Connect JSON) schema; raises EnvelopeError on a disagreement."""
    return compile_value(schema, strict)(value)


def compile_value(schema: Mapping[str, Any], strict: bool = True) -> ValueDecoder:
    """A decoder for values of one field schema; nulls are checked against ``optional``."""
    required = strict and schema.get("optional") is False and "default" not in schema
    inner = _compile_inner(schema, strict)

    def decode(value: Any) -> Any:
        if value is None:
            if required:
                raise EnvelopeError("schema-mismatch", "null in a required (optional=false) field")
            return None
        return inner(value)

    return decode


def _mismatch(expected: str, value: Any) -> EnvelopeError:
    return EnvelopeError("schema-mismatch", f"expected {expected}, got {_t(value)}")


def _compile_inner(schema: Mapping[str, Any], strict: bool) -> ValueDecoder:
    name = schema.get("name")
    kind = schema.get("type")
    logical = _LOGICAL.get(name) if isinstance(name, str) else None
    if logical is not None:
        return functools.partial(_call_logical, logical, schema)
    if kind in _INT_TYPES:

        def as_int(v: Any) -> Any:
            if type(v) is int:  # not bool: type(True) is bool
                return v
            raise _mismatch(f"an integer ({kind})", v)

        return as_int
    if kind in _FLOAT_TYPES:

        def as_float(v: Any) -> Any:
            t = type(v)
            if t is float or t is int or (t is str and v in _FLOAT_WORDS):
                return v
            raise _mismatch(f"a number ({kind})", v)

        return as_float
    if kind == "boolean":

        def as_bool(v: Any) -> Any:
            if type(v) is bool:
                return v
            raise _mismatch("a boolean", v)

        return as_bool
    if kind == "string":

        def as_str(v: Any) -> Any:
            if type(v) is str:
                return v
            raise _mismatch("a string", v)

        return as_str
    if kind == "bytes":
        return _bytes_value
    if kind == "array":
        items = schema.get("items")
        item = compile_value(items, strict) if isinstance(items, dict) else None

        def as_list(v: Any) -> Any:
            if type(v) is not list:
                raise _mismatch("an array", v)
            return v if item is None else [item(x) for x in v]

        return as_list
    if kind == "struct":
        nested = _compile_row(dict(schema), strict, "struct")

        def as_struct(v: Any) -> Any:
            if type(v) is not dict:
                raise _mismatch("a struct", v)
            return nested.decode(v, None, "struct")[0]

        return as_struct
    if kind == "map":

        def as_map(v: Any) -> Any:
            if type(v) is dict or type(v) is list:  # JsonConverter writes non-string-keyed maps as pairs
                return v
            raise _mismatch("a map", v)

        return as_map
    return _identity


def _call_logical(logical: Any, schema: Mapping[str, Any], value: Any) -> Any:
    return logical(value, schema)


def _identity(value: Any) -> Any:
    return value


def _bytes_value(value: Any) -> Any:
    _check_b64(value)
    return value


def _t(value: Any) -> str:
    return type(value).__name__


def _check_b64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise EnvelopeError("schema-mismatch", f"expected base64 bytes, got {_t(value)}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError("schema-mismatch", "bytes are not valid base64") from None


def _plain(d: decimal.Decimal) -> str:
    """Exact plain notation, never an exponent: 1E+3 → "1000", scale kept (12.30 → "12.30")."""
    return format(d, "f")


def _unscaled(raw: bytes, scale: int) -> decimal.Decimal:
    # Built from its digit tuple: exact at any precision (scaleb would round to the context's 28 digits).
    unscaled = int.from_bytes(raw, "big", signed=True) if raw else 0
    digits = tuple(int(c) for c in str(abs(unscaled)))
    return decimal.Decimal((1 if unscaled < 0 else 0, digits, -scale))


_EXACT = decimal.Context(prec=100_000, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def _scale(schema: Mapping[str, Any]) -> int:
    params = schema.get("parameters") or {}
    try:
        return int(params.get("scale", 0))
    except (TypeError, ValueError):
        raise EnvelopeError("schema-mismatch", "Decimal schema has a non-integer 'scale' parameter") from None


# JsonConverter decimal.format=NUMERIC sends decimals as JSON numbers; a binary float keeps 15
# significant digits exactly, so wider numeric columns must use BASE64 or decimal.handling.mode=string.
_FLOAT_EXACT_DIGITS = 15


def _decimal(value: Any, schema: Mapping[str, Any]) -> str:
    scale = _scale(schema)
    if isinstance(value, str):
        return _plain(_unscaled(_check_b64(value), scale))
    if _is_int(value):
        return _plain(decimal.Decimal(value).quantize(decimal.Decimal((0, (1,), -scale)), context=_EXACT))
    if isinstance(value, float):
        d = decimal.Decimal(repr(value))
        if len(d.as_tuple().digits) > _FLOAT_EXACT_DIGITS:
            raise EnvelopeError(
                "inexact-decimal",
                "a numeric decimal wider than 15 digits arrived as a JSON float; use the JsonConverter's "
                "decimal.format=BASE64 or Debezium's decimal.handling.mode=string",
            )
        return _plain(d.quantize(decimal.Decimal((0, (1,), -scale)), context=_EXACT))
    raise EnvelopeError("schema-mismatch", f"expected a Decimal (base64 or number), got {_t(value)}")


def _variable_decimal(value: Any, schema: Mapping[str, Any]) -> str:
    if not isinstance(value, dict) or not _is_int(value.get("scale")):
        raise EnvelopeError("schema-mismatch", "a VariableScaleDecimal must be an object {scale: int, value: base64}")
    return _plain(_unscaled(_check_b64(value.get("value")), value["scale"]))


def _need_int(value: Any, what: str) -> int:
    if not _is_int(value):
        raise EnvelopeError("schema-mismatch", f"expected an integer {what}, got {_t(value)}")
    return int(value)


def _date(value: Any, schema: Mapping[str, Any]) -> str:
    days = _need_int(value, "(days since epoch)")
    try:
        return (_EPOCH_DATE + timedelta(days=days)).isoformat()
    except OverflowError:
        return "infinity" if days > 0 else "-infinity"


def _time_of_day(micros: int) -> str:
    if micros < 0 or micros > _DAY_US:
        raise EnvelopeError("schema-mismatch", f"time of day out of range: {micros} µs")
    seconds, us = divmod(micros, 1_000_000)
    minutes, s = divmod(seconds, 60)
    h, m = divmod(minutes, 60)
    return f"{h:02d}:{m:02d}:{s:02d}.{us:06d}"


def _time_ms(value: Any, schema: Mapping[str, Any]) -> str:
    return _time_of_day(_need_int(value, "(ms of day)") * 1000)


def _time_us(value: Any, schema: Mapping[str, Any]) -> str:
    return _time_of_day(_need_int(value, "(µs of day)"))


def _time_ns(value: Any, schema: Mapping[str, Any]) -> str:
    return _time_of_day(_need_int(value, "(ns of day)") // 1000)


def iso_naive_micros(epoch_us: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffff`` with no zone; beyond year 1..9999 → ``"infinity"`` / ``"-infinity"``.

    Debezium's ``Timestamp``/``MicroTimestamp``/``NanoTimestamp`` encode a ``timestamp without time
    zone`` column: the wall-clock value counted from the epoch as if it were UTC. Writing it with a
    ``Z`` would claim a zone the database never stored.
    """
    try:
        dt = _EPOCH + timedelta(microseconds=epoch_us)
    except OverflowError:
        return "infinity" if epoch_us > 0 else "-infinity"
    # strftime("%Y") does not zero-pad years below 1000 on every platform; format by hand.
    return (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}.{dt.microsecond:06d}"
    )


def _ts_ms(value: Any, schema: Mapping[str, Any]) -> str:
    return iso_naive_micros(_need_int(value, "(epoch ms)") * 1000)


def _ts_us(value: Any, schema: Mapping[str, Any]) -> str:
    return iso_naive_micros(_need_int(value, "(epoch µs)"))


def _ts_ns(value: Any, schema: Mapping[str, Any]) -> str:
    return iso_naive_micros(_need_int(value, "(epoch ns)") // 1000)


def _zoned_ts(value: Any, schema: Mapping[str, Any]) -> str:
    """A ``timestamp with time zone``: kept as Debezium sent it (with its ``Z`` or offset), checked."""
    if not isinstance(value, str):
        raise EnvelopeError("schema-mismatch", f"expected a ZonedTimestamp string, got {_t(value)}")
    if value.lower() in ("infinity", "-infinity"):
        return value.lower()
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise EnvelopeError("schema-mismatch", f"not an ISO-8601 timestamp: {value[:40]!r}") from None
    if dt.tzinfo is None:
        raise EnvelopeError("schema-mismatch", f"a ZonedTimestamp without a zone or offset: {value[:40]!r}")
    return value


def _json(value: Any, schema: Mapping[str, Any]) -> Any:
    if not isinstance(value, str):
        raise EnvelopeError("schema-mismatch", f"expected a JSON document as a string, got {_t(value)}")
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        raise EnvelopeError("schema-mismatch", "an io.debezium.data.Json value is not valid JSON") from None


def _uuid(value: Any, schema: Mapping[str, Any]) -> str:
    if not isinstance(value, str):
        raise EnvelopeError("schema-mismatch", f"expected a UUID string, got {_t(value)}")
    return value.lower()


def _bytes(value: Any, schema: Mapping[str, Any]) -> str:
    _check_b64(value)
    return str(value)


_Decoder = Any  # Callable[[Any, Mapping[str, Any]], Any]; kept loose for the table below
_LOGICAL: dict[str, _Decoder] = {
    "org.apache.kafka.connect.data.Decimal": _decimal,
    "io.debezium.data.VariableScaleDecimal": _variable_decimal,
    "org.apache.kafka.connect.data.Date": _date,
    "io.debezium.time.Date": _date,
    "org.apache.kafka.connect.data.Time": _time_ms,
    "io.debezium.time.Time": _time_ms,
    "io.debezium.time.MicroTime": _time_us,
    "io.debezium.time.NanoTime": _time_ns,
    "org.apache.kafka.connect.data.Timestamp": _ts_ms,
    "io.debezium.time.Timestamp": _ts_ms,
    "io.debezium.time.MicroTimestamp": _ts_us,
    "io.debezium.time.NanoTimestamp": _ts_ns,
    "io.debezium.time.ZonedTimestamp": _zoned_ts,
    "io.debezium.data.Json": _json,
    "io.debezium.data.Uuid": _uuid,
    "io.debezium.data.Bits": _bytes,
}

# Short names accepted in a mapping's ``column_types`` (payload-only topics have no schema).
HINTS: dict[str, str] = {
    "decimal": "org.apache.kafka.connect.data.Decimal",
    "variable-decimal": "io.debezium.data.VariableScaleDecimal",
    "date": "io.debezium.time.Date",
    "time-ms": "io.debezium.time.Time",
    "time-us": "io.debezium.time.MicroTime",
    "time-ns": "io.debezium.time.NanoTime",
    "timestamp-ms": "io.debezium.time.Timestamp",
    "timestamp-us": "io.debezium.time.MicroTimestamp",
    "timestamp-ns": "io.debezium.time.NanoTimestamp",
    "zoned-timestamp": "io.debezium.time.ZonedTimestamp",
    "json": "io.debezium.data.Json",
    "uuid": "io.debezium.data.Uuid",
    "bytes": "io.debezium.data.Bits",
}


def check_hint(hint: str) -> str | None:
    """None if ``hint`` is a valid column type hint (``decimal:<scale>`` or a HINTS key), else why not."""
    base, _, arg = hint.partition(":")
    if base not in HINTS:
        return f"unknown column type {hint!r}; use one of {', '.join(sorted(HINTS))} (decimal:<scale>)"
    if base == "decimal":
        if not arg.isdigit():
            return f"{hint!r}: a decimal needs its scale, e.g. 'decimal:2'"
    elif arg:
        return f"{hint!r}: only 'decimal' takes an argument"
    return None


def hint_schema(hints: Mapping[str, str]) -> dict[str, Any]:
    """A (non-strict) struct schema built from ``column -> hint`` for payload-only records."""
    return _hint_schema(tuple(sorted(hints.items())))


@functools.lru_cache(maxsize=256)
def _hint_schema(hints: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    fields = []
    for column, hint in hints:
        base, _, arg = hint.partition(":")
        f: dict[str, Any] = {"field": column, "type": "any", "optional": True, "name": HINTS[base]}
        if base == "decimal":
            f["parameters"] = {"scale": arg}
        fields.append(f)
    return {"type": "struct", "fields": fields}
