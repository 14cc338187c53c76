"""CDC ingest against the real Kafka: topics created after start, keys and partitions, redelivery, DLQ.

Every test uses its own ``cdc.raw.<unique>.*`` topics, change/DLQ topics and consumer group, and
subscribes ``^cdc\\.raw\\.<unique>\\..*`` (the production pattern is ``^cdc\\.raw\\..*``) so leftovers
of other runs are never read.
"""

from __future__ import annotations

import asyncio
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
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError
from aiokafka.partitioner import DefaultPartitioner

from agents.cdc import CdcIngest, attach, topic_limits
from cdc.convert import Converted, Position, convert
from cdc.mapping_loader import load_mapping
from cdc.plan import TOO_LARGE
from models.deadletter import DeadLetter
from streams.app import create_app
from streams.settings import Settings
from streams.topics import MESSAGE_HEADROOM_BYTES, ensure_topics
from tests.integration.cdc_records import ORDER_SCHEMA, TS, order_record, source

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


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
            cdc_pattern=rf"^cdc\.raw\.{unique}\..*",
            cdc_metadata_max_age_ms=1000,
            cdc_poll_timeout_ms=200,
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

    async def create_topic(self, name: str, partitions: int, max_message_bytes: int | None = None) -> None:
        configs = {"max.message.bytes": str(max_message_bytes)} if max_message_bytes else None
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
        finally:
            await admin.close()

    async def set_max_message_bytes(self, topic: str, size: int) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            res = ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": str(size)})
            await admin.alter_configs([res])
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
    settings = env.settings if group is None else env.settings.replace(cdc_group_id=group)
    ingest = CdcIngest(settings, env.mapping)
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
        "placed": "2026-01-15T10:00:00.000001",  # a timestamp without time zone: no Z
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
        "CAUSEWAY_CDC_PATTERN": env.settings.cdc_pattern,
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
    ingest = attach(app, env.settings, env.mapping)
    await app.start()
    try:
        await env.create_topic(f"{env.raw}.orders", 1)
        await env.publish(f"{env.raw}.orders", [order_record("c", 5, 77)])
        (got,) = await env.read(env.settings.objects_topic, 1)
    finally:
        await app.stop()
    assert got.key == b"prod::5"
    assert ingest.stats.events == 1


# --- sizes: a record the change topic cannot take never wedges the loop ------------------------------


def fat_order(id_: int, lsn: int, note_bytes: int) -> tuple[bytes, bytes]:
    """A payload-only order with a ``note`` column of ``note_bytes`` characters."""
    payload = {"before": None, "after": {"id": id_, "note": "n" * note_bytes}, "source": source("orders", lsn),
               "op": "c", "ts_ms": TS}  # fmt: skip
    return orjson.dumps({"id": id_}), orjson.dumps(payload)


async def test_an_event_too_large_for_an_existing_change_topic_is_dead_lettered_and_the_loop_goes_on(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    # The change topic exists already, with a limit below what CAUSEWAY_MAX_EVENT_BYTES (20 000) needs.
    await env.create_topic(env.settings.objects_topic, 1, max_message_bytes=6_000)
    topic = f"{env.raw}.orders"
    await env.create_topic(topic, 1)
    with caplog.at_level("WARNING", logger="agents.cdc"):
        ingest, task = await running(env)
    try:
        assert any(
            f"topic {env.settings.objects_topic} has max.message.bytes=6000" in r.getMessage() for r in caplog.records
        ), "start-up must warn about a change topic too small for CAUSEWAY_MAX_EVENT_BYTES"
        await env.publish(topic, [fat_order(1, 100, 10), fat_order(2, 101, 9_000), fat_order(3, 102, 10)])
        (letter_rec,) = await env.read(env.settings.dlq_topic, 1)
        events = await env.read(env.settings.objects_topic, 2)
        await env.publish(topic, [fat_order(4, 103, 10)])  # the loop goes on
        events = await env.read(env.settings.objects_topic, 3)
    finally:
        await halt(ingest, task)
    letter = DeadLetter.from_record(letter_rec.key, letter_rec.value, letter_rec.headers)
    assert (letter.reason, letter.topic, letter.offset, letter.world_id) == (TOO_LARGE, topic, 1, "prod")
    assert letter.value is not None and orjson.loads(letter.value)["after"]["id"] == 2  # the raw record, unchanged
    assert [orjson.loads(r.value)["object_pk"] for r in events] == ["1", "3", "4"]
    assert ingest.stats.too_large == 1 and ingest.stats.produce_failures == 0
    await _assert_committed(env, ingest.group_id, {topic: 4})
    status = ingest.status()
    assert status.last_commit_at is not None and status.last_failure is None


async def test_a_limit_lowered_after_start_is_survived_record_by_record(env: Env) -> None:
    """The broker refuses a batch the ingest thought fit: produced again one by one, the refused one dead-lettered."""
    topic = f"{env.raw}.orders"
    await env.create_topic(topic, 1)
    ingest, task = await running(env)  # creates the change topics with a fitting limit, and reads it
    try:
        assert ingest.limits[env.settings.objects_topic] >= env.settings.max_event_bytes
        await env.set_max_message_bytes(env.settings.objects_topic, 6_000)
        small = [fat_order(1, 100, 10), fat_order(3, 102, 10), fat_order(4, 103, 10)]
        await env.publish(topic, [small[0], fat_order(2, 101, 9_000), small[1]])
        (letter_rec,) = await env.read(env.settings.dlq_topic, 1)
        await env.publish(topic, [small[2]])  # the loop goes on
        ids = {_event_id(env, topic, value) for _, value in small}
        seen = await env.collect(env.settings.objects_topic, ids, within_s=60)
    finally:
        await halt(ingest, task)
    letter = DeadLetter.from_record(letter_rec.key, letter_rec.value, letter_rec.headers)
    assert (letter.reason, letter.offset) == (TOO_LARGE, 1)
    assert set(seen) == ids  # every small one, the refused one only as a dead letter
    assert all(v == vs[0] for vs in seen.values() for v in vs)  # a copy produced again is byte-identical
    assert ingest.stats.too_large == 1 and ingest.stats.refused_batches == 1
    assert ingest.limits[env.settings.objects_topic] == 6_000  # re-read after the refusal
    await _assert_committed(env, ingest.group_id, {topic: 4})


def _event_id(env: Env, topic: str, value: bytes) -> str:
    result = convert(value, env.mapping, Position(topic, 0, 0), env.settings.max_event_bytes)
    assert isinstance(result, Converted)
    return result.events[0].event.event_id


async def test_change_topics_causeway_creates_take_events_up_to_max_event_bytes(env: Env) -> None:
    settings = env.settings.replace(max_event_bytes=1_500_000)
    created = await ensure_topics(settings)
    assert set(created) >= {settings.objects_topic, settings.dlq_topic}
    limits = await topic_limits(env.bootstrap, [settings.objects_topic, settings.links_topic, settings.dlq_topic])
    assert limits[settings.objects_topic] == 1_500_000 + MESSAGE_HEADROOM_BYTES
    assert limits[settings.dlq_topic] >= 1_500_000 + MESSAGE_HEADROOM_BYTES

    # End to end: a 1.2 MB row (over the broker's 1 MiB default) becomes a 1.2 MB event on that topic.
    topic = f"{env.raw}.orders"
    await env.create_topic(topic, 1, max_message_bytes=2_000_000)
    ingest = CdcIngest(settings, env.mapping)
    await ingest.start()
    task = asyncio.create_task(ingest.run())
    try:
        producer = AIOKafkaProducer(bootstrap_servers=env.bootstrap, acks="all", max_request_size=2_000_000)
        await producer.start()
        try:
            key, value = fat_order(1, 100, 1_200_000)
            await producer.send_and_wait(topic, value, key=key)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            settings.objects_topic, bootstrap_servers=env.bootstrap, auto_offset_reset="earliest",
            fetch_max_bytes=4_000_000, max_partition_fetch_bytes=4_000_000,
        )  # fmt: skip
        await consumer.start()
        try:
            got = await asyncio.wait_for(consumer.getone(), 60)
        finally:
            await consumer.stop()
    finally:
        await halt(ingest, task)
    assert len(got.value) > 1_200_000 and orjson.loads(got.value)["object_pk"] == "1"
    assert ingest.stats.too_large == 0


async def test_worker_with_a_bad_mapping_prints_the_problems_and_creates_no_topic(env: Env) -> None:
    proc_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "CAUSEWAY_OBJECTS_TOPIC": env.settings.objects_topic,
        "CAUSEWAY_LINKS_TOPIC": env.settings.links_topic,
        "CAUSEWAY_DLQ_TOPIC": env.settings.dlq_topic,
        "CAUSEWAY_APP_ID": env.settings.app_id,
        "CAUSEWAY_CDC_MAPPING": orjson.dumps({"tables": [{"topic": "orders", "world": "prod"}]}).decode(),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli.main", "worker", "--web-port", str(_free_port()),
        env=proc_env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    text = (out + err).decode()
    assert proc.returncode not in (0, None), text
    assert "Traceback" not in text
    assert "tables[0].topic: 'orders' must be a topic name starting with 'cdc.raw.'" in text
    assert "tables[0]: give exactly one of 'object_type' or 'link'" in text
    admin = AIOKafkaAdminClient(bootstrap_servers=env.bootstrap)
    await admin.start()
    try:
        topics = set(await admin.list_topics())
    finally:
        await admin.close()
    assert not {env.settings.objects_topic, env.settings.links_topic, env.settings.dlq_topic} & topics


async def _until(condition: Any, within_s: float = 60.0) -> None:
    for _ in range(int(within_s / 0.2)):
        if condition():
            return
        await asyncio.sleep(0.2)


async def test_status_shows_records_waiting_while_produce_fails_and_clears_after(env: Env) -> None:
    """What a health check reads: waiting records and no commit while the produce fails, then recovery."""
    topic = f"{env.raw}.orders"
    await env.create_topic(topic, 1)
    ingest = CdcIngest(env.settings.replace(cdc_retry_backoff_s=0.2), env.mapping)
    await ingest.start()
    real_produce = ingest._produce
    failing = True

    async def produce(producer: Any, outgoing: Any, *sent: Any) -> None:
        if failing:
            raise KafkaConnectionError("injected: broker unreachable")
        await real_produce(producer, outgoing, *sent)

    ingest._produce = produce  # type: ignore[method-assign]
    task = asyncio.create_task(ingest.run())
    try:
        await env.publish(topic, [order_record("c", i, 500 + i) for i in range(5)])
        await _until(lambda: ingest.status().records_waiting >= 5)
        stuck = ingest.status()
        assert stuck.records_waiting == 5 and stuck.last_commit_at is None
        assert stuck.last_failure is not None and "injected" in stuck.last_failure
        assert stuck.stalled(time.time() + 120, after_s=60)
        failing = False
        await env.read(env.settings.objects_topic, 5)
        await _until(lambda: ingest.status().last_commit_at is not None)
    finally:
        await halt(ingest, task)
    done = ingest.status()
    assert done.records_waiting == 0 and done.last_commit_at is not None and done.last_failure is None
    assert not done.stalled(time.time() + 120, after_s=60)
    assert ingest.stats.produce_failures >= 1


async def test_the_worker_runs_the_ingest_with_the_cdc_settings(env: Env, tmp_path: Path) -> None:
    """``causeway worker`` with CAUSEWAY_CDC_*: its ingest uses the configured pattern and group."""
    from bench.procs import start_worker, stop, worker_env

    orders = f"{env.raw}.orders"
    decoy = f"cdc.raw.{env.unique}x.other"  # another team's topic: the default pattern matches it
    await env.create_topic(orders, 1)
    await env.create_topic(decoy, 1)
    await env.publish(decoy, [order_record("c", 9, 90)])
    world = f"t{env.unique}"  # no branch: the applier dead-letters its events, nothing is committed
    mapping = {"tables": [{"topic": orders, "world": world, "object_type": "Order", "pk": "id"}]}
    group = f"cdc-group-{env.unique}"
    proc_env = worker_env(env.settings.replace(warehouse=f"file://{tmp_path}/warehouse")) | {
        "CAUSEWAY_CDC_MAPPING": orjson.dumps(mapping).decode(),
        "CAUSEWAY_CDC_PATTERN": env.settings.cdc_pattern,
        "CAUSEWAY_CDC_GROUP_ID": group,
        "CAUSEWAY_CDC_METADATA_MAX_AGE_MS": "1000",
    }
    worker = await asyncio.to_thread(start_worker, proc_env, tmp_path / "worker.log", timeout=120)
    try:
        await env.publish(orders, [order_record("c", 5, 77)])
        (got,) = await env.read(env.settings.objects_topic, 1)
        committed: dict[str, int] = {}
        for _ in range(150):
            committed = await _group_offsets(env, group)
            if committed.get(orders):
                break
            await asyncio.sleep(0.2)
    finally:
        await asyncio.to_thread(stop, [worker.proc])
    assert got.key == f"{world}::5".encode()
    assert committed == {orders: 1}, "the configured group read the mapped topic, and only it"
    assert await _group_offsets(env, f"{env.settings.app_id}-cdc") == {}, "the default group was not used"


async def _group_offsets(env: Env, group: str) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=env.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    out: dict[str, int] = {}
    for tp, meta in offsets.items():
        out[tp.topic] = out.get(tp.topic, 0) + meta.offset
    return out
