"""Reconciliation against the real Kafka and Nessie: drift made behind the worker's back is repaired once."""

from __future__ import annotations

import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from click.testing import CliRunner
from pyiceberg.expressions import In

from agents.reconcile import ControlCount, Reconciler, reconcile
from agents.schema_sync import SchemaStore
from cli.main import cli
from models.events import ChangeEvent, ChangeType, EntityKind
from models.schema import validate_change
from monitoring.metrics import Metrics
from sinks.committer import Batch, BatchCommitter, Source
from sinks.nessie import Reference, SyncNessieClient
from sinks.readback import read_world
from streams.settings import Settings, env_name

pytestmark = pytest.mark.integration


def event(world: str, typ: str, pk: str, version: int, change: ChangeType = ChangeType.CREATE) -> ChangeEvent:
    return ChangeEvent(
        event_id=f"{pk}-{version}-{uuid.uuid4().hex[:6]}",
        world_id=world,
        kind=EntityKind.OBJECT,
        entity_type=typ,
        entity_pk=pk,
        change_type=change,
        version=version,
        before=None,
        after=None if change is ChangeType.DELETE else {"n": version, "pk": pk},
        caused_by=None,
        causal_order=None,
        occurred_at_ms=int(time.time() * 1000),
        schema_version=0,
        source="test",
    )


@pytest.fixture
def rec_settings(settings: Settings, warehouse: str, unique: str, nessie_url: str, kafka_bootstrap: str) -> Settings:
    return settings.replace(warehouse=warehouse, control_counts_topic=f"counts.{unique}", commit_backoff_s=0.02)


async def test_drift_behind_the_workers_back_is_detected_repaired_and_second_run_is_a_noop(
    rec_settings: Settings, unique: str
) -> None:
    s = rec_settings
    world = f"t{unique}"
    client = SyncNessieClient(s.nessie_url)
    branch = f"world-{world}"
    client.create_branch(branch, Reference("main", "BRANCH", client.config().no_ancestor_hash))
    committer = BatchCommitter(s, client)
    evs = [event(world, "Pump", f"p{i}", 1) for i in range(20)] + [event(world, "Valve", f"v{i}", 1) for i in range(5)]
    evs += [event(world, "Pump", "p0", 2), event(world, "Pump", "p1", 2, ChangeType.DELETE)]
    items = [(e, Source("objs", 0, i)) for i, e in enumerate(evs)]
    committer.commit_batch(Batch.from_sources(world, "b1", items))
    before = read_world(s, world)

    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        for c in (ControlCount(world, "Pump", 19, 1), ControlCount(world, "Valve", 5, 1)):
            await producer.send_and_wait(s.control_counts_topic, c.encode(), key=c.key)
    finally:
        await producer.stop()

    # A typed column for Pump.n: repaired rows must come back typed, not only as JSON.
    typed = validate_change(
        {"change_id": "n1", "world_id": world, "kind": "object", "type_name": "Pump", "version": 1, "occurred_at": 0,
         "changes": [{"op": "add", "id": "n", "name": "n", "type": "long"}]}
    )  # fmt: skip
    assert SchemaStore(s, committer).apply(typed).verdict == "applied"

    metrics = Metrics()
    rec = Reconciler(s, committer, metrics)
    clean = await reconcile(s, [world], reconciler=rec)
    assert clean[0].outcome == "ok" and clean[0].drift == {"Pump": 0, "Valve": 0}

    # Behind the worker's back: a direct commit that deletes rows (pyiceberg copy-on-write delete).
    cat = committer.catalog(branch)
    cat.load_table("onto.entity_common").delete(In("object_pk", ["p0", "p5", "p6", "v2"]))
    assert len(read_world(s, world).objects) == len(before.objects) - 4

    dry = await reconcile(s, [world], reconciler=rec, dry_run=True)
    assert dry[0].outcome == "ok" and dry[0].drift == {"Pump": 3, "Valve": 1}
    head = client.get_reference(branch).hash

    repaired = await reconcile(s, [world], reconciler=rec)
    r = repaired[0]
    assert r.outcome == "repaired" and r.drift == {"Pump": 3, "Valve": 1}
    assert r.types["Pump"].projection == 16 and r.types["Pump"].log == 19 and r.types["Pump"].control == 19
    after = read_world(s, world)
    assert after.objects == before.objects
    typed_rows = cat.load_table("onto.entity_common").scan(selected_fields=("object_pk", "p_pump__n", "deleted"))
    by_pk = {r["object_pk"]: r["p_pump__n"] for r in typed_rows.to_arrow().to_pylist() if not r["deleted"]}
    assert by_pk["p0"] == 2 and by_pk["p5"] == 1 and by_pk["v2"] is None
    assert client.get_reference(branch).hash != head

    reg = metrics.registry
    assert reg.get_sample_value("causeway_reconciliation_runs_total", {"world": world, "outcome": "repaired"}) == 1
    assert reg.get_sample_value("causeway_reconciliation_repairs_total", {"world": world}) == 2
    assert reg.get_sample_value("causeway_reconciliation_drift", {"world": world, "object_type": "Pump"}) == 3
    assert reg.get_sample_value("causeway_reconciliation_last_run_timestamp_seconds", {"world": world}) > 0

    # Twice in a row: the second run finds nothing and commits nothing.
    head = client.get_reference(branch).hash
    again = await reconcile(s, [world], reconciler=rec)
    assert again[0].outcome == "ok" and again[0].drift == {"Pump": 0, "Valve": 0} and again[0].commit is None
    assert client.get_reference(branch).hash == head
    assert reg.get_sample_value("causeway_reconciliation_runs_total", {"world": world, "outcome": "ok"}) == 2
    assert reg.get_sample_value("causeway_reconciliation_drift", {"world": world, "object_type": "Pump"}) == 0


def test_cli_reports_per_type_counts(rec_settings: Settings, unique: str) -> None:
    s = rec_settings
    world = f"t{unique}"
    with SyncNessieClient(s.nessie_url) as client:
        client.create_branch(f"world-{world}", Reference("main", "BRANCH", client.config().no_ancestor_hash))
        BatchCommitter(s, client).commit_batch(
            Batch.from_sources(world, "b1", [(event(world, "Pump", "p1", 1), Source("objs", 0, 0))])
        )
    env = {env_name(k): (v.reveal() if hasattr(v, "reveal") else str(v)) for k, v in vars(s).items()}
    result = CliRunner().invoke(cli, ["reconcile", "--world", world, "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    assert f"{world}: ok (dry run)" in result.output and "Pump" in result.output
