"""Debezium timestamps keep their zone semantics from the envelope to the Iceberg column.

``Timestamp`` / ``MicroTimestamp`` / ``NanoTimestamp`` are a ``timestamp without time zone``: the
decoded value is a naive ISO-8601 string (no ``Z``), and a ``timestamp`` property stores it in an
Iceberg ``timestamp`` column as the same wall-clock value. ``ZonedTimestamp`` is kept as Debezium
sent it (offset included) and a ``timestamptz`` property stores the instant in ``timestamptz``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, TimestampType, TimestamptzType

from cdc.convert import Converted, Position, convert
from cdc.mapping_loader import load_mapping
from models.events import EntityKind
from models.schema import PropType, Verdict, decide, validate_change
from sinks.rows import typed_columns
from sinks.tables import iceberg_type
from tests.unit.test_debezium import TS, field, payload, wrap

TOPIC = "cdc.raw.erp.shipments"
MAPPING = load_mapping({"tables": [{"topic": TOPIC, "world": "prod", "object_type": "Shipment", "pk": "id"}]})
ROW = [
    field("id", "int32", optional=False),
    field("packed", "int64", logical="io.debezium.time.Timestamp"),
    field("picked", "int64", logical="io.debezium.time.MicroTimestamp"),
    field("scanned", "int64", logical="io.debezium.time.NanoTimestamp"),
    field("shipped", "string", logical="io.debezium.time.ZonedTimestamp"),
]
AFTER = {
    "id": 1,
    "packed": TS + 123,  # 2026-01-15 10:00:00.123 on the database's wall clock
    "picked": TS * 1000 + 123456,
    "scanned": TS * 1_000_000 + 123456789,
    "shipped": "2026-01-15T12:00:00.5+02:00",
}


def after_properties() -> dict[str, object]:
    result = convert(orjson.dumps(wrap(payload("c", after=AFTER), ROW)), MAPPING, Position(TOPIC, 0, 0))
    assert isinstance(result, Converted), result
    (ev,) = result.events
    assert ev.event.after is not None
    return ev.event.after


def test_timestamps_without_a_zone_stay_naive_and_zoned_ones_keep_their_offset() -> None:
    after = after_properties()
    assert after["packed"] == "2026-01-15T10:00:00.123000"
    assert after["picked"] == "2026-01-15T10:00:00.123456"
    assert after["scanned"] == "2026-01-15T10:00:00.123456"  # ns truncated to µs, as Iceberg stores
    assert after["shipped"] == "2026-01-15T12:00:00.5+02:00"  # as Debezium sent it


def test_naive_ones_map_to_iceberg_timestamp_and_zoned_ones_to_timestamptz() -> None:
    adds = [{"op": "add", "id": f"p{i}", "name": n, "type": t} for i, (n, t) in enumerate(
        [("packed", "timestamp"), ("picked", "timestamp"), ("scanned", "timestamp"), ("shipped", "timestamptz")]
    )]  # fmt: skip
    doc = {"change_id": "c1", "world_id": "prod", "kind": "object", "type_name": "Shipment", "version": 1,
           "occurred_at": "2026-01-01T00:00:00Z", "changes": adds}  # fmt: skip
    decision = decide(None, validate_change(doc))
    assert decision.verdict is Verdict.APPLY
    contract = decision.schema
    assert iceberg_type(PropType.parse("timestamp")) == TimestampType()
    assert iceberg_type(PropType.parse("timestamptz")) == TimestamptzType()

    fields = [NestedField(i + 1, p.column("Shipment"), iceberg_type(p.type)) for i, p in enumerate(contract.properties)]
    arrow = schema_to_pyarrow(Schema(*fields))
    result = convert(orjson.dumps(wrap(payload("c", after=AFTER), ROW)), MAPPING, Position(TOPIC, 0, 0))
    assert isinstance(result, Converted) and result.events[0].event.kind is EntityKind.OBJECT
    cols = typed_columns(arrow, {"Shipment": contract}, [result.events[0].event], [False])
    table = pa.table(cols)
    assert table.schema.field("p_shipment__picked").type == pa.timestamp("us")  # no zone
    assert table.schema.field("p_shipment__shipped").type == pa.timestamp("us", tz="UTC")
    row = table.to_pylist()[0]
    assert row["p_shipment__packed"] == datetime(2026, 1, 15, 10, 0, 0, 123000)  # the wall-clock value
    assert row["p_shipment__picked"] == datetime(2026, 1, 15, 10, 0, 0, 123456)
    assert row["p_shipment__scanned"] == datetime(2026, 1, 15, 10, 0, 0, 123456)
    assert row["p_shipment__shipped"] == datetime(2026, 1, 15, 10, 0, 0, 500000, tzinfo=UTC)  # the instant
