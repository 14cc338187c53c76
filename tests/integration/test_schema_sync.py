"""Schema sync against the real Kafka and Nessie: typed columns appear, stay readable, and refuse narrowing."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from agents.schema_sync import SchemaStore, SchemaSync
from cli.workload import Record
from models.deadletter import DeadLetter
from models.events import ChangeEvent, ChangeType, EntityKind
from models.schema import StorageSchemaUpdated, validate_change
from monitoring.metrics import Metrics
from sinks.catalog import NessieCatalog
from sinks.committer import Batch, BatchCommitter, Source
from streams.settings import Settings
from tests import factories
from tests.factories import change_event
from tests.integration import schema_sync_fixtures as ssf
from tests.integration.pipeline import Pipeline
from tests.integration.schema_sync_fixtures import read_topic, wait_for

pytestmark = pytest.mark.integration
sync_settings, world, agent = ssf.sync_settings, ssf.world, ssf.agent

TYPE = "Equipment"


def event(world: str, pk: str, version: int, **after: object) -> ChangeEvent:
    return change_event(
        f"{pk}-{version}-{uuid.uuid4().hex[:6]}",
        world=world,
        entity_type=TYPE,
        pk=pk,
        change=ChangeType.CREATE if version == 1 else ChangeType.UPDATE,
        version=version,
        after=dict(after),
        occurred_at_ms=int(time.time() * 1000),
    )


def schema_change(world: str, version: int, *ops: dict[str, object]) -> bytes:
    return factories.schema_change(world, version, *ops, type_name=TYPE)


def rows(cat: NessieCatalog, *cols: str) -> dict[str, dict[str, object]]:
    t = cat.load_table("onto.entity_common").scan(selected_fields=("object_pk", *cols)).to_arrow()
    return {r["object_pk"]: r for r in t.to_pylist()}


async def test_agent_adds_renames_widens_in_version_order_and_refuses_narrowing(
    sync_settings: Settings, world: str, agent: SchemaSync
) -> None:
    s = sync_settings
    committer = BatchCommitter(s)
    offsets = iter(range(10_000))

    def commit(*evs: ChangeEvent) -> None:
        items = [(e, Source("objs", 0, next(offsets))) for e in evs]
        committer.commit_batch(Batch.from_sources(world, uuid.uuid4().hex, items))

    # Events carrying properties no schema knows yet: kept in the JSON column.
    commit(event(world, "a", 1, status="ok", temp=20), event(world, "b", 1, status="broken", extra="x"))
    cat = committer.catalog(f"world-{world}")
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        v1 = schema_change(world, 1, {"op": "add", "id": "p1", "name": "status", "type": "string"},
                           {"op": "add", "id": "p2", "name": "temp", "type": "int"})  # fmt: skip
        sent = time.monotonic()
        await producer.send_and_wait(s.schema_topic, v1)
        await wait_for(lambda: "p_equipment__status" in cat.load_table("onto.entity_common").schema().column_names,
                       what="the added column")  # fmt: skip
        delay_ms = (time.monotonic() - sent) * 1000
        print(f"\nschema.updated → Iceberg column visible on the branch: {delay_ms:.0f} ms")
        got = rows(cat, "p_equipment__status", "p_equipment__temp")
        assert got["a"]["p_equipment__status"] == "ok" and got["a"]["p_equipment__temp"] == 20
        assert got["b"]["p_equipment__status"] == "broken" and got["b"]["p_equipment__temp"] is None

        # v3 before v2: the gap waits; v2 arrives; both apply in order.
        v2 = schema_change(world, 2, {"op": "rename", "id": "p1", "name": "state"})
        v3 = schema_change(world, 3, {"op": "widen", "id": "p2", "type": "long"})
        await producer.send_and_wait(s.schema_topic, v3)
        await asyncio.sleep(1.0)
        assert "p_equipment__status" in cat.load_table("onto.entity_common").schema().column_names
        assert agent.summary()["waiting"] == 1
        await producer.send_and_wait(s.schema_topic, v2)
        await wait_for(lambda: str(cat.load_table("onto.entity_common").schema().find_field("p_equipment__temp")
                                   .field_type) == "long", what="rename then widen")  # fmt: skip
        # Old data files are read under the new name; new events use the new name.
        commit(event(world, "c", 1, state="new", temp=2**40))
        got = rows(cat, "p_equipment__state", "p_equipment__temp")
        assert {k: v["p_equipment__state"] for k, v in got.items()} == {"a": "ok", "b": "broken", "c": "new"}
        assert got["c"]["p_equipment__temp"] == 2**40

        # Narrowing is refused: dead letter with the reason, a metric, an answer; schema unchanged.
        v4 = schema_change(world, 4, {"op": "widen", "id": "p2", "type": "int"})
        await producer.send_and_wait(s.schema_topic, v4)
        letters = await read_topic(s, s.dlq_topic, 1)
        dl = DeadLetter.from_record(None, letters[0][0], letters[0][1])
        assert dl.reason == "narrowing" and "long → int" in dl.detail
        answers = [StorageSchemaUpdated.decode(v) for v, _ in await read_topic(s, s.schema_answer_topic, 4)]
        assert [(a.requested_version, a.status, a.version) for a in answers] == [
            (1, "applied", 1), (2, "applied", 2), (3, "applied", 3), (4, "refused", 3)
        ]  # fmt: skip
        assert str(cat.load_table("onto.entity_common").schema().find_field("p_equipment__temp").field_type) == "long"
        refused = agent.metrics.registry.get_sample_value(
            "causeway_schema_changes_total", {"world": world, "outcome": "refused", "reason": "narrowing"}
        )
        assert refused == 1
        reg = agent.metrics.registry
        assert reg.get_sample_value("causeway_schema_version", {"world": world, "layer": "data"}) == 3
        assert reg.get_sample_value("causeway_schema_version", {"world": world, "layer": "control"}) == 4
        assert reg.get_sample_value("causeway_version_vector_difference", {"world": world}) == 1
    finally:
        await producer.stop()


async def test_property_added_while_a_worker_applies_events(unique: str, tmp_path: Path) -> None:
    """Events before, racing and after a schema change all end up with the typed value."""
    pipe = await Pipeline.create(unique, tmp_path, batch_max_events=50, batch_max_seconds=0.1)
    world = f"t{unique[:8]}-w"
    store = SchemaStore(pipe.settings)

    def record(pk: str, version: int, level: int) -> Record:
        ev = event(world, pk, version, level=level, name=pk)
        return Record(EntityKind.OBJECT, ev.key.encode(), ev.encode(), ev)

    try:
        pipe.start_worker()
        await pipe.publish([record(f"before-{i}", 1, i) for i in range(100)])
        await pipe.wait_drained(60)
        change = validate_change(orjson.loads(schema_change(world, 1, {"op": "add", "id": "lvl", "name": "level",
                                                                       "type": "long"})))  # fmt: skip

        async def flow() -> None:
            for k in range(10):
                await pipe.publish([record(f"race-{k}-{i}", 1, 1000 + i) for i in range(30)])
                await asyncio.sleep(0.05)

        results = await asyncio.gather(flow(), asyncio.to_thread(store.apply, change))
        assert results[1].verdict == "applied"
        await pipe.publish([record(f"after-{i}", 1, 5000 + i) for i in range(50)])
        await pipe.publish([record(f"before-{i}", 2, 9000 + i) for i in range(10)])  # updates of old rows
        await pipe.wait_drained(60)
    finally:
        pipe.stop_all()
    cat = NessieCatalog.from_settings(pipe.settings, f"world-{world}")
    got = rows(cat, "properties", "p_equipment__level")
    assert len(got) == 100 + 300 + 50
    wrong = {pk: r for pk, r in got.items() if r["p_equipment__level"] != orjson.loads(r["properties"])["level"]}
    assert not wrong, list(wrong.items())[:3]
    assert got["before-3"]["p_equipment__level"] == 9003


def test_a_batch_racing_the_schema_commit_is_rebuilt_with_the_typed_column(sync_settings: Settings, world: str) -> None:
    """Deterministic race: the schema commit lands between a batch's planning and its publish."""
    s = sync_settings
    store = SchemaStore(s)
    change = validate_change(orjson.loads(schema_change(world, 1, {"op": "add", "id": "t", "name": "temp",
                                                                   "type": "double"})))  # fmt: skip

    def schema_lands_first(cat: NessieCatalog, batch: Batch, attempt: int) -> None:
        if attempt == 1:
            assert store.apply(change).verdict == "applied"

    racer = BatchCommitter(s, before_publish=schema_lands_first)
    first = BatchCommitter(s).commit_batch(
        Batch.from_sources(world, "b0", [(event(world, "old", 1, temp=1.5), Source("objs", 0, 0))])
    )
    assert first.attempts == 1
    outcome = racer.commit_batch(
        Batch.from_sources(world, "b1", [(event(world, "new", 1, temp=2), Source("objs", 0, 1))])
    )
    assert outcome.attempts == 2  # conflicted with the schema commit, rebuilt on the new head
    got = rows(racer.catalog(f"world-{world}"), "p_equipment__temp")
    assert got["old"]["p_equipment__temp"] == 1.5  # backfilled by the schema commit
    assert got["new"]["p_equipment__temp"] == 2.0  # written typed by the retried batch


async def test_intelligence_acknowledgements_survive_a_restart_and_bad_changes_are_answered(
    sync_settings: Settings, world: str
) -> None:
    """Issues 19.6 and 19.2 against Kafka: the vector is rebuilt on start; an undecodable change is answered."""
    s = sync_settings
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        async with SchemaSync(s, Metrics(), poll_timeout_ms=100) as first:
            task = asyncio.create_task(first.run())
            v1 = schema_change(world, 1, {"op": "add", "id": "p1", "name": "status", "type": "string"})
            await producer.send_and_wait(s.schema_topic, v1)
            bad = orjson.loads(schema_change(world, 2, {"op": "add", "id": "p2", "name": "n", "type": "int"}))
            bad["changes"][0]["type"] = "varchar"
            await producer.send_and_wait(s.schema_topic, orjson.dumps(bad))
            ack = orjson.dumps({"world_id": world, "version": 1})
            await producer.send_and_wait(s.schema_intelligence_topic, ack)
            await wait_for(lambda: first.vectors.get(world) and first.vectors[world].intelligence == 1,
                           timeout=40, what="the acknowledgement")  # fmt: skip
            await asyncio.sleep(0.5)  # the step that read it commits its offset
        task.cancel()
        answers = [StorageSchemaUpdated.decode(v) for v, _ in await read_topic(s, s.schema_answer_topic, 2)]
        assert [(a.change_id, a.status, a.reason) for a in answers] == [
            (answers[0].change_id, "applied", None), (bad["change_id"], "refused", "bad-type")
        ]  # fmt: skip

        # A new process (same group): nothing new is published, yet the vector has all three layers.
        second = SchemaSync(s, Metrics(), poll_timeout_ms=100)
        await second.start()
        task = asyncio.create_task(second.run())
        try:
            reg = second.metrics.registry

            def layer(name: str) -> float | None:
                return reg.get_sample_value("causeway_schema_version", {"world": world, "layer": name})

            await wait_for(lambda: layer("intelligence") == 1, timeout=40, what="the re-read acknowledgement")
            assert layer("data") == 1 and layer("control") == 1
            assert reg.get_sample_value("causeway_version_vector_difference", {"world": world}) == 0
        finally:
            await second.stop()
            task.cancel()
    finally:
        await producer.stop()


def test_a_decimal_that_would_round_is_left_null_counted_and_kept_in_the_json(
    sync_settings: Settings, world: str
) -> None:
    """Issue 19.3 against Nessie: "99.999" into decimal(12,2) was stored as 100.00."""
    s = sync_settings
    change = validate_change(orjson.loads(schema_change(world, 1, {"op": "add", "id": "f", "name": "flow",
                                                                   "type": "decimal(12,2)"})))  # fmt: skip
    assert SchemaStore(s).apply(change).verdict == "applied"
    committer = BatchCommitter(s)
    items = [(event(world, "a", 1, flow="99.999"), Source("objs", 0, 0))]
    items.append((event(world, "b", 1, flow="12.5"), Source("objs", 0, 1)))
    outcome = committer.commit_batch(Batch.from_sources(world, "b-dec", items))
    assert outcome.stats["entity_common"].values_unconverted == 1
    got = rows(committer.catalog(f"world-{world}"), "properties", "p_equipment__flow")
    assert got["a"]["p_equipment__flow"] is None and orjson.loads(got["a"]["properties"])["flow"] == "99.999"
    assert str(got["b"]["p_equipment__flow"]) == "12.50"
    metrics = Metrics()
    metrics.committed(
        world, duration_s=0.1, rows=2, nbytes=1, unconverted=outcome.stats["entity_common"].values_unconverted
    )
    assert metrics.registry.get_sample_value("causeway_typed_values_unconverted_total", {"world": world}) == 1
