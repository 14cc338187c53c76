"""Debezium envelopes: every op, every logical type we decode, wrapper vs payload-only, non-row records.

The builders at the top are shared by the other CDC unit tests.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from cdc.debezium import (
    UNAVAILABLE_PLACEHOLDER,
    EnvelopeError,
    Op,
    SkipKind,
    Skipped,
    check_hint,
    decode_value,
    iso_naive_micros,
    loads,
)
from tests.debezium_records import (
    TS,
    dec_b64,
    env_of,
    field,
    mysql_source,
    payload,
    pg_source,
    raw,
    wrap,
)

# --- ops -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("wrapped", [True, False])
def test_create(wrapped: bool) -> None:
    pl = payload("c", after={"id": 1, "customer": "acme", "total": dec_b64("12.30", 2)})
    env = env_of(wrap(pl) if wrapped else pl)
    assert env.op is Op.CREATE and env.has_schema is wrapped
    assert env.source.lsn == 24023128 and env.source.table == "orders" and env.source.schema == "public"
    assert env.source.ts_ms == TS and env.ts_ms == TS + 5
    img = env.images()
    assert img.before is None
    if wrapped:
        assert img.after == {"id": 1, "customer": "acme", "total": "12.30"}
    else:  # no schema: the base64 decimal cannot be recognised, it passes through
        assert img.after == {"id": 1, "customer": "acme", "total": dec_b64("12.30", 2)}


def test_update_delete_read_truncate() -> None:
    before = {"id": 1, "customer": "acme", "total": dec_b64("1.00", 2)}
    after = {"id": 1, "customer": "acme2", "total": dec_b64("-7.05", 2)}
    up = env_of(wrap(payload("u", before, after))).images()
    assert up.before == {"id": 1, "customer": "acme", "total": "1.00"}
    assert up.after == {"id": 1, "customer": "acme2", "total": "-7.05"}

    d = env_of(wrap(payload("d", before=before)))
    assert d.op is Op.DELETE and d.images().after is None and d.images().before is not None

    r = env_of(wrap(payload("r", after=after, source=pg_source(snapshot="true"))))
    assert r.op is Op.READ and r.source.snapshot == "true"

    t = env_of(wrap(payload("t")))
    assert t.op is Op.TRUNCATE and t.images().before is None and t.images().after is None


def test_mysql_source_position() -> None:
    env = env_of(payload("c", after={"id": 1}, source=mysql_source(pos=9000, row=2)))
    assert env.source.binlog_file == "mysql-bin.000003"
    assert (env.source.binlog_pos, env.source.binlog_row, env.source.lsn) == (9000, 2, None)
    assert env.source.qualified_table == "shop.orders"


def test_ops_need_their_images() -> None:
    with pytest.raises(EnvelopeError) as exc:
        loads(raw(payload("c")))
    assert exc.value.reason == "missing-after"
    with pytest.raises(EnvelopeError) as exc:
        loads(raw(payload("d")))
    assert exc.value.reason == "missing-before"
    with pytest.raises(EnvelopeError) as exc:
        loads(raw(payload("x", after={"id": 1})))
    assert exc.value.reason == "unknown-op"


# --- records that are not row changes --------------------------------------------------------------


def test_tombstones() -> None:
    assert loads(None) == Skipped(SkipKind.TOMBSTONE)
    assert loads(b"") == Skipped(SkipKind.TOMBSTONE)
    assert loads(b"null") == Skipped(SkipKind.TOMBSTONE)
    assert loads(raw({"schema": None, "payload": None})) == Skipped(SkipKind.TOMBSTONE)


def test_heartbeat() -> None:
    assert loads(raw({"ts_ms": TS})) == Skipped(SkipKind.HEARTBEAT)
    wrapped = {
        "schema": {"type": "struct", "name": "io.debezium.connector.common.Heartbeat",
                   "fields": [{"type": "int64", "optional": False, "field": "ts_ms"}]},
        "payload": {"ts_ms": TS},
    }  # fmt: skip
    assert loads(raw(wrapped)) == Skipped(SkipKind.HEARTBEAT)


def test_schema_change() -> None:
    ddl = {
        "source": mysql_source(),
        "ts_ms": TS,
        "databaseName": "shop",
        "schemaName": None,
        "ddl": "ALTER TABLE orders ADD COLUMN note VARCHAR(20)",
        "tableChanges": [],
    }
    assert loads(raw(ddl)) == Skipped(SkipKind.SCHEMA_CHANGE)
    wrapped = {"schema": {"type": "struct", "name": "io.debezium.connector.mysql.SchemaChangeValue",
                          "fields": []}, "payload": ddl}  # fmt: skip
    assert loads(raw(wrapped)) == Skipped(SkipKind.SCHEMA_CHANGE)


def test_transaction_metadata_and_messages() -> None:
    tx = {"status": "END", "id": "571:53195832", "ts_ms": TS, "event_count": 2, "data_collections": []}
    assert loads(raw(tx)) == Skipped(SkipKind.TRANSACTION)
    msg = {"op": "m", "ts_ms": TS, "source": pg_source(), "message": {"prefix": "x", "content": "eA=="}}
    assert loads(raw(msg)) == Skipped(SkipKind.MESSAGE)


# --- TOAST / unavailable values ---------------------------------------------------------------------


def test_unavailable_placeholder_is_dropped_and_recorded() -> None:
    fields = [
        field("id", "int32", optional=False),
        field("notes", "string"),
        field("doc", "string", logical="io.debezium.data.Json"),
        field("blob", "bytes"),
    ]
    fields += [
        {
            "type": "array",
            "items": {"type": "string", "optional": True},
            "optional": True,
            "field": "tags",
        }
    ]
    after = {
        "id": 1,
        "notes": UNAVAILABLE_PLACEHOLDER,
        "doc": UNAVAILABLE_PLACEHOLDER,
        "blob": base64.b64encode(UNAVAILABLE_PLACEHOLDER.encode()).decode(),
        "tags": [UNAVAILABLE_PLACEHOLDER],
    }
    img = env_of(wrap(payload("u", after=after), fields)).images()
    assert img.after == {"id": 1}
    assert img.unavailable == ("notes", "doc", "blob", "tags")
    # payload-only too, and with a custom placeholder
    img2 = env_of(payload("u", after={"id": 1, "notes": "??"})).images(placeholder="??")
    assert img2.after == {"id": 1} and img2.unavailable == ("notes",)


# --- logical types ----------------------------------------------------------------------------------


def one(value: Any, type_: str, logical: str | None = None, **params: str) -> Any:
    schema: dict[str, Any] = {"type": type_, "field": "x"}
    if logical:
        schema["name"] = logical
    if params:
        schema["parameters"] = params
    return decode_value(value, schema)


DEC = "org.apache.kafka.connect.data.Decimal"


@pytest.mark.parametrize(
    ("text", "scale"),
    [("12.30", 2), ("-0.01", 2), ("0", 0), ("123456789012345678901234567890.123456789", 9), ("-128", 0)],
)
def test_decimal_base64(text: str, scale: int) -> None:
    assert one(dec_b64(text, scale), "bytes", DEC, scale=str(scale)) == text


def test_decimal_numeric_format_and_precision_guard() -> None:
    assert one(12.3, "bytes", DEC, scale="2") == "12.30"
    assert one(5, "bytes", DEC, scale="3") == "5.000"
    with pytest.raises(EnvelopeError) as exc:
        one(1234567890.1234567, "bytes", DEC, scale="7")
    assert exc.value.reason == "inexact-decimal"


def test_variable_scale_decimal() -> None:
    v = {"scale": 3, "value": dec_b64("-1.234", 3)}
    assert one(v, "struct", "io.debezium.data.VariableScaleDecimal") == "-1.234"
    assert one({"scale": 0, "value": dec_b64("1000", 0)}, "struct", "io.debezium.data.VariableScaleDecimal") == "1000"


def test_decimal_string_mode_passes_through() -> None:
    assert one("12.30", "string") == "12.30"  # decimal.handling.mode=string


@pytest.mark.parametrize("logical", ["org.apache.kafka.connect.data.Date", "io.debezium.time.Date"])
def test_date(logical: str) -> None:
    assert one(20468, "int32", logical) == "2026-01-15"
    assert one(-1, "int32", logical) == "1969-12-31"
    assert one(10**9, "int32", logical) == "infinity"


@pytest.mark.parametrize(
    ("value", "logical", "expected"),
    [
        (36_000_123, "org.apache.kafka.connect.data.Time", "10:00:00.123000"),
        (36_000_123, "io.debezium.time.Time", "10:00:00.123000"),
        (36_000_123_456, "io.debezium.time.MicroTime", "10:00:00.123456"),
        (36_000_123_456_789, "io.debezium.time.NanoTime", "10:00:00.123456"),
        (86_400_000_000, "io.debezium.time.MicroTime", "24:00:00.000000"),
    ],
)
def test_time(value: int, logical: str, expected: str) -> None:
    assert one(value, "int64", logical) == expected


@pytest.mark.parametrize(
    ("value", "logical", "expected"),
    [
        (TS + 123, "org.apache.kafka.connect.data.Timestamp", "2026-01-15T10:00:00.123000"),
        (TS + 123, "io.debezium.time.Timestamp", "2026-01-15T10:00:00.123000"),
        (TS * 1000 + 123456, "io.debezium.time.MicroTimestamp", "2026-01-15T10:00:00.123456"),
        (TS * 1_000_000 + 123456789, "io.debezium.time.NanoTimestamp", "2026-01-15T10:00:00.123456"),
        (-1, "io.debezium.time.MicroTimestamp", "1969-12-31T23:59:59.999999"),
        (9223372036825200000, "io.debezium.time.MicroTimestamp", "infinity"),
        (-9223372036832400000, "io.debezium.time.MicroTimestamp", "-infinity"),
    ],
)
def test_timestamps(value: int, logical: str, expected: str) -> None:
    assert one(value, "int64", logical) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-01-15T10:00:00Z", "2026-01-15T10:00:00Z"),
        ("2026-01-15T12:00:00.5+02:00", "2026-01-15T12:00:00.5+02:00"),
        ("2026-01-15T10:00:00.123456789Z", "2026-01-15T10:00:00.123456789Z"),
        ("0099-01-01T00:00:00Z", "0099-01-01T00:00:00Z"),
        ("infinity", "infinity"),
    ],
)
def test_zoned_timestamp(value: str, expected: str) -> None:
    assert one(value, "string", "io.debezium.time.ZonedTimestamp") == expected


def test_iso_naive_micros_format() -> None:
    assert iso_naive_micros(0) == "1970-01-01T00:00:00.000000"
    assert iso_naive_micros(-62135596800 * 10**6) == "0001-01-01T00:00:00.000000"


def test_a_zoned_timestamp_without_a_zone_is_a_schema_mismatch() -> None:
    with pytest.raises(EnvelopeError) as exc:
        one("2026-01-15T10:00:00", "string", "io.debezium.time.ZonedTimestamp")
    assert exc.value.reason == "schema-mismatch"


def test_json_uuid_bytes_bits_and_plain_types() -> None:
    assert one('{"a": [1, 2]}', "string", "io.debezium.data.Json") == {"a": [1, 2]}
    assert one("6F9619FF-8B86-D011-B42D-00C04FC964FF", "string", "io.debezium.data.Uuid") == (
        "6f9619ff-8b86-d011-b42d-00c04fc964ff"
    )
    assert one("AQID", "bytes") == "AQID"
    assert one("AQ==", "bytes", "io.debezium.data.Bits", length="8") == "AQ=="
    assert one(True, "boolean") is True
    assert one(2**62, "int64") == 2**62
    assert one(1.5, "float64") == 1.5
    assert one("NaN", "float64") == "NaN"
    assert one("active", "string", "io.debezium.data.Enum", allowed="active,closed") == "active"
    assert one(2026, "int32", "io.debezium.time.Year") == 2026
    assert one(None, "string") is None


def test_arrays_and_structs_decode_their_members() -> None:
    arr = {"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}, "field": "x"}
    assert decode_value([0, 1], arr) == ["1970-01-01", "1970-01-02"]
    point = {
        "type": "struct",
        "name": "io.debezium.data.geometry.Point",
        "fields": [
            field("x", "float64"),
            field("y", "float64"),
            field("wkb", "bytes"),
            field("srid", "int32"),
        ],
    }
    assert decode_value({"x": 1.0, "y": 2.0, "wkb": None, "srid": None}, point) == {
        "x": 1.0,
        "y": 2.0,
        "wkb": None,
        "srid": None,
    }


@pytest.mark.parametrize(
    ("value", "type_", "logical"),
    [
        ("1", "int32", None),
        (True, "int64", None),
        (1, "string", None),
        ("x", "boolean", None),
        ("not base64!", "bytes", None),
        ("AQ==", "bytes", DEC),  # fine...
    ][:-1]
    + [
        ({"a": 1}, "float64", None),
        ("2026-01-15", "int32", "io.debezium.time.Date"),
        (12, "string", "io.debezium.time.ZonedTimestamp"),
        ("yesterday", "string", "io.debezium.time.ZonedTimestamp"),
        ("{not json", "string", "io.debezium.data.Json"),
        ({"scale": "2", "value": "AQ=="}, "struct", "io.debezium.data.VariableScaleDecimal"),
        (-5, "int64", "io.debezium.time.MicroTime"),
    ],
)
def test_type_disagreements_are_schema_mismatch(value: Any, type_: str, logical: str | None) -> None:
    with pytest.raises(EnvelopeError) as exc:
        one(value, type_, logical)
    assert exc.value.reason == "schema-mismatch"


def test_before_image_may_hold_nulls_in_required_columns() -> None:
    # Postgres REPLICA IDENTITY DEFAULT: a delete's before image has only the key filled in.
    fields = [field("id", "int32", optional=False), field("customer", "string", optional=False)]
    img = env_of(wrap(payload("d", before={"id": 1, "customer": None}), fields)).images()
    assert img.before == {"id": 1, "customer": None}


def test_required_null_and_undeclared_column_are_mismatches() -> None:
    with pytest.raises(EnvelopeError) as exc:
        env_of(wrap(payload("c", after={"id": None, "customer": "a", "total": None}))).images()
    assert exc.value.reason == "schema-mismatch" and "'id'" in exc.value.detail
    with pytest.raises(EnvelopeError) as exc:
        env_of(wrap(payload("c", after={"id": 1, "customer": "a", "total": None, "extra": 1}))).images()
    assert exc.value.reason == "schema-mismatch" and "extra" in exc.value.detail


# --- payload-only fallback: column type hints --------------------------------------------------------


def test_hints_decode_payload_only_records() -> None:
    after = {"id": 1, "total": dec_b64("9.99", 2), "day": 20468, "at": TS * 1000, "other": "x"}
    env = env_of(payload("c", after=after))
    img = env.images({"total": "decimal:2", "day": "date", "at": "timestamp-us"})
    assert img.after == {
        "id": 1,
        "total": "9.99",
        "day": "2026-01-15",
        "at": "2026-01-15T10:00:00.000000",
        "other": "x",
    }
    # hints are ignored when the record carries its own schema
    wrapped = env_of(wrap(payload("c", after={"id": 1, "customer": "a", "total": dec_b64("1.50", 2)})))
    assert wrapped.images({"total": "date"}).after == {"id": 1, "customer": "a", "total": "1.50"}


def test_hint_validation() -> None:
    assert check_hint("decimal:2") is None and check_hint("timestamp-ms") is None
    assert check_hint("decimal") is not None
    assert check_hint("date:3") is not None
    assert check_hint("money") is not None


# --- envelope-level errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{not json", "malformed-json"),
        (b"\xff\xfe", "malformed-json"),
        (b"[1, 2]", "not-an-envelope"),
        (b'"text"', "not-an-envelope"),
        (raw({"id": 1, "name": "flattened"}), "not-an-envelope"),
        (raw({"schema": 5, "payload": payload("c", after={"id": 1})}), "bad-schema"),
        (raw({"schema": None, "payload": [1]}), "not-an-envelope"),
        (raw({**payload("c", after={"id": 1}), "source": None}), "missing-source"),
        (raw({**payload("c", after={"id": 1}), "source": {"db": "x"}}), "missing-source"),
        (raw({**payload("c", after={"id": 1}), "source": pg_source(lsn="abc")}), "bad-source"),
        (raw(payload("c", after=[1])), "bad-envelope"),  # type: ignore[arg-type]
        (raw({**payload("c", after={"id": 1}), "ts_ms": "now"}), "bad-envelope"),
        (raw({"schema": {"type": "struct", "fields": []}, "payload": payload("c", after={"id": 1})}),
         "schema-mismatch"),
    ],
)  # fmt: skip
def test_bad_envelopes(value: bytes, reason: str) -> None:
    with pytest.raises(EnvelopeError) as exc:
        loads(value)
    assert exc.value.reason == reason


def test_oversized() -> None:
    with pytest.raises(EnvelopeError) as exc:
        loads(raw(payload("c", after={"id": 1, "blob": "x" * 2000})), max_bytes=1000)
    assert exc.value.reason == "oversized"
