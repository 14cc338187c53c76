"""Debezium records of an ``erp.public.orders`` table as a PostgreSQL connector writes them, for the
CDC ingest tests against the real broker."""

from __future__ import annotations

import base64
from typing import Any

import orjson

TS = 1768471200000


def source(table: str, lsn: int, **over: Any) -> dict[str, Any]:
    src = {"connector": "postgresql", "name": "erp", "ts_ms": TS, "snapshot": "false", "db": "erp"}
    src.update({"schema": "public", "table": table, "txId": 1, "lsn": lsn})
    src.update(over)
    return src


def dec(text: str, scale: int) -> str:
    unscaled = int(text.replace(".", ""))
    return base64.b64encode(unscaled.to_bytes(8, "big", signed=True)).decode()


DECIMAL = "org.apache.kafka.connect.data.Decimal"
MICROS = "io.debezium.time.MicroTimestamp"
ROW_FIELDS = [
    {"field": "id", "type": "int32", "optional": False},
    {"field": "total", "type": "bytes", "optional": True, "name": DECIMAL, "parameters": {"scale": "2"}},
    {"field": "placed", "type": "int64", "optional": True, "name": MICROS},
]
ORDER_SCHEMA = {
    "type": "struct",
    "optional": False,
    "name": "erp.public.orders.Envelope",
    "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": ROW_FIELDS},
        {"field": "after", "type": "struct", "optional": True, "fields": ROW_FIELDS},
        {"field": "source", "type": "struct", "optional": False, "fields": []},
        {"field": "op", "type": "string", "optional": False},
        {"field": "ts_ms", "type": "int64", "optional": True},
    ],
}


def order_record(op: str, id_: int, lsn: int, total: str | None = "10.00") -> tuple[bytes, bytes]:
    row = None if total is None else {"id": id_, "total": dec(total, 2), "placed": TS * 1000 + 1}
    before = {"id": id_, "total": None, "placed": None} if op == "d" else None
    payload = {"before": before, "after": None if op == "d" else row, "source": source("orders", lsn),
               "op": op, "ts_ms": TS}  # fmt: skip
    return orjson.dumps({"id": id_}), orjson.dumps({"schema": ORDER_SCHEMA, "payload": payload})
