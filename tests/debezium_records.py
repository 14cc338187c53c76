"""Debezium records as a connector writes them, and a mapped ``orders`` table to convert them with:
shared by the CDC mapping, plan and ingest tests."""

from __future__ import annotations

import base64
import dataclasses
import decimal
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.debezium import Envelope, loads
from cdc.mapping_loader import load_mapping
from streams.settings import Settings

TS = 1768471200000  # 2026-01-15T10:00:00Z


def pg_source(**over: Any) -> dict[str, Any]:
    src: dict[str, Any] = {
        "version": "2.7.0.Final",
        "connector": "postgresql",
        "name": "erp",
        "ts_ms": TS,
        "snapshot": "false",
        "db": "erp",
        "sequence": '["24023000","24023128"]',
        "schema": "public",
        "table": "orders",
        "txId": 767,
        "lsn": 24023128,
        "xmin": None,
    }
    src.update(over)
    return src


def mysql_source(**over: Any) -> dict[str, Any]:
    src: dict[str, Any] = {
        "version": "2.7.0.Final",
        "connector": "mysql",
        "name": "shop",
        "ts_ms": TS,
        "snapshot": "false",
        "db": "shop",
        "table": "orders",
        "server_id": 223344,
        "gtid": None,
        "file": "mysql-bin.000003",
        "pos": 154,
        "row": 0,
        "thread": 7,
        "query": None,
    }
    src.update(over)
    return src


def payload(
    op: str,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "before": before,
        "after": after,
        "source": source if source is not None else pg_source(),
        "op": op,
        "ts_ms": TS + 5,
        "transaction": None,
    }


def field(name: str, type_: str, optional: bool = True, logical: str | None = None, **params: str) -> dict:
    f: dict[str, Any] = {"type": type_, "optional": optional, "field": name}
    if logical:
        f["name"] = logical
    if params:
        f["parameters"] = params
    return f


def envelope_schema(row_fields: list[dict[str, Any]]) -> dict[str, Any]:
    row = {"type": "struct", "fields": row_fields, "optional": True, "name": "erp.public.orders.Value"}
    return {
        "type": "struct",
        "name": "erp.public.orders.Envelope",
        "optional": False,
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "struct", "fields": [], "optional": False, "field": "source",
             "name": "io.debezium.connector.postgresql.Source"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }  # fmt: skip


ORDER_FIELDS = [
    field("id", "int32", optional=False),
    field("customer", "string"),
    field("total", "bytes", logical="org.apache.kafka.connect.data.Decimal", scale="2"),
]


def wrap(pl: dict[str, Any] | None, row_fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"schema": envelope_schema(row_fields if row_fields is not None else ORDER_FIELDS), "payload": pl}


def dec_b64(value: str, scale: int) -> str:
    unscaled = int(decimal.Decimal(value).scaleb(scale, context=decimal.Context(prec=1000)))
    n = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(n, "big", signed=True)).decode()


def raw(doc: Any) -> bytes:
    return orjson.dumps(doc)


def env_of(doc: Any) -> Envelope:
    parsed = loads(raw(doc))
    assert isinstance(parsed, Envelope)
    return parsed


TOPIC = "cdc.raw.erp.orders"
MAPPING = load_mapping(
    {
        "tables": [
            {"topic": TOPIC, "world": "prod", "object_type": "Order", "pk": ["id"]},
            {"topic": "cdc.raw.erp.tenanted", "world": {"column": "tenant"}, "object_type": "T", "pk": "id"},
        ]
    }
)
SETTINGS = Settings(objects_topic="objs", links_topic="links", dlq_topic="dlq", max_event_bytes=4096)


def j(doc: Any) -> bytes:
    return orjson.dumps(doc)


def good(id_: Any = 1, **more: Any) -> bytes:
    return j(payload("c", after={"id": id_, "customer": "acme", **more}))


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = b'{"id":1}'
    headers: list[tuple[str, bytes]] = dataclasses.field(default_factory=list)
