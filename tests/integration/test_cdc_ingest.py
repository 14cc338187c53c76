"""CDC ingest against the real Kafka: topics created after start, keys and partitions, redelivery, DLQ.

Every test uses its own ``cdc.raw.<unique>.*`` topics, change/DLQ topics and consumer group, and
subscribes ``^cdc\\.raw\\.<unique>\\..*`` (the production pattern is ``^cdc\\.raw\\..*``) so leftovers
of other runs are never read.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.partitioner import DefaultPartitioner

from agents.cdc import CdcIngest, IngestOptions, attach
from agents.cdc_mapping import Converted, Position, convert, load_mapping
from models.deadletter import DeadLetter
from streams.app import create_app
from streams.settings import Settings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

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


def link_record(supplier: str, part: str, lsn: int) -> tuple[bytes, bytes]:
    payload = {"before": None, "after": {"supplier": supplier, "part": part, "qty": 3},
               "source": source("supplies", lsn), "op": "c", "ts_ms": TS}  # fmt: skip
    return orjson.dumps({"supplier": supplier, "part": part}), orjson.dumps(payload)


class Env:
    def __init__(self, bootstrap: str, unique: str) -> None:
        self.unique = unique
        self.bootstrap = bootstrap
        self.settings = Settings.from_env().replace(
            objects_topic=f"onto.changes.objects.{unique}",
            links_topic=f"onto.changes.links.{unique}",
            dlq_topic=f"causeway.dlq.{unique}",
            app_id=f"causeway-test-{unique}",
            max_event_bytes=20_000,
        )
        self.raw = f"cdc.raw.{unique}"
        self.mapping_doc: dict[str, Any] = {
                "tables": [
                    {"topic": f"{self.raw}.orders", "world": "prod", "object_type": "Order", "pk": "id",
                     "rename": {"total": "amount"}},
                    {"source": {"db": "erp", "table": "supplies"}, "world": "w-supply",
                     "link": {"type": "Supplies", "from": "supplier", "to": "part"},
                     "pk": ["supplier", "part"]},
                ]
            }  # fmt: skip
        self.mapping = load_mapping(self.mapping_doc)
        self.options = IngestOptions(pattern=rf"^cdc\.raw\.{unique}\..*", metadata_max_age_ms=1000, poll_timeout_ms=200)

    async def create_topic(self, name: str, partitions: int) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            await admin.close()

    async def publish(self, topic: str, records: Sequence[tuple[bytes | None, bytes | None]]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            for key, value in records:
                await producer.send_and_wait(topic, value, key=key)
        finally:
            await producer.stop()

    async def read(self, topic: str, n: int, within_s: float = 60.0) -> list[Any]:
        """Read ``n`` records from the start of ``topic`` (fails after ``within_s`` seconds)."""
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        got: list[Any] = []
        try:
            deadline = time.monotonic() + within_s
            while len(got) < n and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    got.extend(records)
        finally:
            await consumer.stop()
        assert len(got) >= n, f"expected {n} records on {topic}, got {len(got)}"
        return got

    async def collect(self, topic: str, expected: set[str], within_s: float) -> dict[str, list[bytes]]:
        """Every value on ``topic`` by event id, read until all ``expected`` ids were seen."""
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        seen: dict[str, list[bytes]] = {}
        try:
            deadline = time.monotonic() + within_s
            while not expected <= set(seen) and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for r in records:
                        seen.setdefault(orjson.loads(r.value)["event_id"], []).append(r.value)
        finally:
            await consumer.stop()
        return seen

    async def partitions(self, topic: str) -> list[int]:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap)
        await producer.start()
        try:
            return sorted(await producer.partitions_for(topic))
        finally:
            await producer.stop()


async def running(env: Env, group: str | None = None) -> tuple[CdcIngest, asyncio.Task[None]]:
    options = env.options if group is None else IngestOptions(**{**env.options.__dict__, "group_id": group})
    ingest = CdcIngest(env.settings, env.mapping, options)
    await ingest.start()
    return ingest, asyncio.create_task(ingest.run())


async def halt(ingest: CdcIngest, task: asyncio.Task[None]) -> None:
    ingest.stop_soon()
    await asyncio.wait_for(task, 30)
    await ingest.stop()


@pytest.fixture
async def env(kafka_bootstrap: str, unique: str) -> AsyncIterator[Env]:
    yield Env(kafka_bootstrap, unique)


async def test_topics_created_after_start_are_ingested_with_keys_and_partitions(env: Env) -> None:
    ingest, task = await running(env)
    try:
        # The topics appear only now, after the ingest subscribed its pattern.
        await env.create_topic(f"{env.raw}.orders", 2)
        records: list[tuple[bytes | None, bytes | None]] = [order_record("c", i, 1000 + i) for i in range(6)]
        records += [order_record("u", 1, 2000, "12.34"), order_record("d", 2, 2001)]
        records += [(orjson.dumps({"id": 2}), None)]  # the tombstone after a delete
        await env.publish(f"{env.raw}.orders", records)
        got = await env.read(env.settings.objects_topic, 8)

        # A table created later still gets picked up (pattern + metadata refresh).
        await env.create_topic(f"{env.raw}.supplies", 1)
        await env.publish(f"{env.raw}.supplies", [link_record("s1", "p1", 3000), link_record("s1", "p2", 3001)])
        links = await env.read(env.settings.links_topic, 2)
    finally:
        await halt(ingest, task)

    docs = [orjson.loads(r.value) for r in got]
    assert len(docs) == 8
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r, doc in zip(got, docs, strict=True):
        assert r.key == f"prod::{doc['object_pk']}".encode()
        by_key.setdefault(doc["object_pk"], []).append(doc)
    assert [d["change_type"] for d in by_key["1"]] == ["CREATE", "UPDATE"]  # per-key order kept
    assert [d["change_type"] for d in by_key["2"]] == ["CREATE", "DELETE"]
    created = by_key["0"][0]
    assert created["after_properties"] == {
        "id": 0,
        "amount": "10.00",
        "placed": "2026-01-15T10:00:00.000001Z",
    }
    assert created["version"] == 1000 and created["occurred_at"] == TS and created["object_type"] == "Order"
    assert by_key["1"][1]["after_properties"]["amount"] == "12.34"

    # Keys land where Kafka's default partitioner puts them on the change topic.
    parts = await env.partitions(env.settings.objects_topic)
    assert len(parts) == env.settings.topic_partitions
    partitioner = DefaultPartitioner()
    for r in got:
        assert r.partition == partitioner(r.key, parts, parts)
    assert len({r.partition for r in got}) > 1

    link_docs = [orjson.loads(r.value) for r in links]
    assert {d["link_pk"] for d in link_docs} == {"s1|p1", "s1|p2"}
    assert {r.key for r in links} == {b"w-supply::s1|p1", b"w-supply::s1|p2"}
    assert all(d["link_type"] == "Supplies" and d["from_pk"] == "s1" for d in link_docs)

    assert ingest.stats.ignored["tombstone"] == 1
    # Offsets were committed only after the events were produced: all of them.
    await _assert_committed(env, ingest.group_id, {f"{env.raw}.orders": 9, f"{env.raw}.supplies": 2})


async def _assert_committed(env: Env, group: str, totals: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=env.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    per_topic: dict[str, int] = {}
    for tp, meta in offsets.items():
        per_topic[tp.topic] = per_topic.get(tp.topic, 0) + meta.offset
    assert per_topic == totals


async def test_redelivery_produces_the_same_event_ids(env: Env) -> None:
    ingest, task = await running(env)
    try:
        await env.create_topic(f"{env.raw}.orders", 3)
        await env.publish(f"{env.raw}.orders", [order_record("c", i, 500 + i) for i in range(10)])
        await env.read(env.settings.objects_topic, 10)
    finally:
        await halt(ingest, task)
    # A second consumer group re-reads the same CDC records from the start: a full redelivery.
    again, task2 = await running(env, group=f"{ingest.group_id}-again")
    try:
        got = await env.read(env.settings.objects_topic, 20)
    finally:
        await again.stop()  # stop() under a running loop: the loop ends cleanly
        await asyncio.wait_for(task2, 30)
    ids: dict[str, list[bytes]] = {}
    for r in got:
        ids.setdefault(orjson.loads(r.value)["event_id"], []).append(r.value)
    assert len(ids) == 10
    assert all(len(v) == 2 and v[0] == v[1] for v in ids.values()), "same id, same bytes"


async def test_bad_records_go_to_the_dlq_with_reasons_and_the_loop_goes_on(env: Env) -> None:
    ingest, task = await running(env)
    topic = f"{env.raw}.orders"
    try:
        await env.create_topic(topic, 1)
        await env.create_topic(f"{env.raw}.unknown", 1)
        good_key, good_value = order_record("c", 42, 9000)
        bad: list[tuple[bytes | None, bytes | None]] = [
            (b"k1", b"{not json"),
            (b"k2", orjson.dumps({"op": "x", "after": {"id": 1}, "source": source("orders", 1)})),
            (b"k3", orjson.dumps({"op": "c", "after": {"id": None}, "source": source("orders", 2)})),
            (b"k4", orjson.dumps({"schema": ORDER_SCHEMA, "payload": {
                "op": "c", "before": None, "after": {"id": "one", "total": None, "placed": None},
                "source": source("orders", 3), "ts_ms": TS}})),
            (b"k5", b'{"op": "c", "pad": "' + b"x" * 30_000 + b'"}'),
            (b"k6", orjson.dumps({"ts_ms": TS})),  # heartbeat: skipped, not dead-lettered
            (good_key, good_value),
        ]  # fmt: skip
        await env.publish(topic, bad)
        await env.publish(f"{env.raw}.unknown", [order_record("c", 1, 1)])
        dlq = await env.read(env.settings.dlq_topic, 6)
        events = await env.read(env.settings.objects_topic, 1)
    finally:
        await halt(ingest, task)

    letters = [DeadLetter.from_record(r.key, r.value, r.headers) for r in dlq]
    reasons = {(dl.topic, dl.offset): dl.reason for dl in letters}
    assert reasons == {
        (topic, 0): "malformed-json",
        (topic, 1): "unknown-op",
        (topic, 2): "null-pk",
        (topic, 3): "schema-mismatch",
        (topic, 4): "oversized",
        (f"{env.raw}.unknown", 0): "unmapped-table",
    }
    first = next(dl for dl in letters if dl.offset == 0 and dl.topic == topic)
    assert first.value == b"{not json" and first.key == b"k1" and first.partition == 0 and first.detail
    assert orjson.loads(events[0].value)["object_pk"] == "42"
    assert ingest.stats.ignored["heartbeat"] == 1
    assert sum(ingest.stats.rejected.values()) == 6


async def test_kill_9_mid_stream_loses_nothing_and_duplicates_are_identical(env: Env, tmp_path: Path) -> None:
    """A real worker process is killed with SIGKILL while records stream in, then restarted."""
    topic = f"{env.raw}.orders"
    await env.create_topic(topic, 2)
    records = [order_record("c" if i % 3 else "u", i % 400, 10_000 + i) for i in range(1500)]
    expected: set[str] = set()
    for _key, value in records:
        result = convert(value, env.mapping, Position(topic, 0, 0), env.settings.max_event_bytes)
        assert isinstance(result, Converted)
        expected.update(ev.event.event_id for ev in result.events)

    proc_env = {
        **os.environ,
        "CAUSEWAY_OBJECTS_TOPIC": env.settings.objects_topic,
        "CAUSEWAY_LINKS_TOPIC": env.settings.links_topic,
        "CAUSEWAY_DLQ_TOPIC": env.settings.dlq_topic,
        "CAUSEWAY_APP_ID": env.settings.app_id,
        "CAUSEWAY_MAX_EVENT_BYTES": str(env.settings.max_event_bytes),
        "CAUSEWAY_CDC_MAPPING": orjson.dumps(env.mapping_doc).decode(),
        "CAUSEWAY_CDC_PATTERN": env.options.pattern,
        "CAUSEWAY_CDC_METADATA_MAX_AGE_MS": "1000",
        "CAUSEWAY_CDC_MAX_RECORDS": "40",
    }

    logs = []

    async def spawn(n: int) -> asyncio.subprocess.Process:
        logs.append(open(tmp_path / f"worker-{n}.log", "wb"))  # noqa: ASYNC230
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agents.cdc", env=proc_env, cwd=REPO, stdout=logs[-1], stderr=logs[-1]
        )

    killed = asyncio.Event()

    async def publish_slowly() -> None:
        """Stream the records in chunks; the second half only after the kill, so it lands mid-stream."""
        producer = AIOKafkaProducer(bootstrap_servers=env.bootstrap, acks="all")
        await producer.start()
        try:
            for i in range(0, len(records), 25):
                if i >= len(records) // 2:
                    await killed.wait()
                for key, value in records[i : i + 25]:
                    await producer.send(topic, value, key=key)
                await producer.flush()
                await asyncio.sleep(0.02)
        finally:
            await producer.stop()

    first = await spawn(1)
    publisher = asyncio.create_task(publish_slowly())
    try:
        await env.read(env.settings.objects_topic, 300)
        first.kill()  # SIGKILL, by pid: no chance to commit or flush anything
        await first.wait()
        killed.set()
        second = await spawn(2)
        try:
            await publisher
            seen = await env.collect(env.settings.objects_topic, expected, within_s=90)
            assert set(seen) == expected, f"{len(expected - set(seen))} events lost"
            for values in seen.values():
                assert all(v == values[0] for v in values), "a redelivered event must be byte-identical"
            duplicates = sum(len(v) - 1 for v in seen.values())
            print(f"events: {len(expected)}, duplicates after kill -9: {duplicates}")
        finally:
            second.kill()
            await second.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
        publisher.cancel()
        for f in logs:
            f.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_attached_to_the_faust_worker_app_it_starts_and_stops_with_it(env: Env) -> None:
    app = create_app(env.settings.replace(web_port=_free_port()))
    ingest = attach(app, env.settings, env.mapping, options=env.options)
    await app.start()
    try:
        await env.create_topic(f"{env.raw}.orders", 1)
        await env.publish(f"{env.raw}.orders", [order_record("c", 5, 77)])
        (got,) = await env.read(env.settings.objects_topic, 1)
    finally:
        await app.stop()
    assert got.key == b"prod::5"
    assert ingest.stats.events == 1
