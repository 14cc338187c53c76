"""Partition evolution as a schema-sync control event, against the real Kafka and Nessie."""

from __future__ import annotations

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from models.deadletter import DeadLetter
from sinks.committer import BatchCommitter
from sinks.layout import DEFAULT_LAYOUTS, format_spec
from sinks.tables import ALL_TABLES, COMMON
from streams.settings import Settings
from tests.integration import schema_sync_fixtures as ssf
from tests.integration.layout_helpers import (
    cat_of,
    legacy_world_with_data,
    objects,
    writes_reads_and_rebuild_after_evolution,
)
from tests.integration.schema_sync_fixtures import read_topic, wait_for

pytestmark = pytest.mark.integration
sync_settings, world, agent = ssf.sync_settings, ssf.world, ssf.agent


def layout_event(change_id: str, world_id: str, table: str, **fields: object) -> bytes:
    return orjson.dumps({"event": "table.layout.evolve", "change_id": change_id, "world_id": world_id, "table": table,
                         **fields})  # fmt: skip


async def test_a_layout_event_evolves_a_world_with_data_like_the_cli(
    sync_settings: Settings,
    world: str,
    agent,  # noqa: ANN001
) -> None:
    s = sync_settings
    committer = BatchCommitter(s)
    first, before = legacy_world_with_data(committer, world)
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        # A dry run answers the old and new spec and commits nothing.
        head = committer.client.get_reference(f"world-{world}").hash
        await producer.send_and_wait(s.schema_topic, layout_event("dry", world, COMMON.name, spec="default",
                                                                  dry_run=True))  # fmt: skip
        answers = [orjson.loads(v) for v, _ in await read_topic(s, s.schema_answer_topic, 1)]
        assert answers[0]["status"] == "dry-run" and answers[0]["table"] == COMMON.name
        assert answers[0]["old"]["spec"] == "none"
        assert answers[0]["new"]["spec"] == format_spec(DEFAULT_LAYOUTS[COMMON.name].spec)
        assert committer.client.get_reference(f"world-{world}").hash == head

        # A bad spec is refused: an answer and a dead letter with the reason, nothing committed.
        await producer.send_and_wait(s.schema_topic, layout_event("bad", world, COMMON.name, spec="bucket(x, y)"))
        answers = [orjson.loads(v) for v, _ in await read_topic(s, s.schema_answer_topic, 2)]
        assert answers[1]["status"] == "refused" and answers[1]["reason"].startswith("bad-layout")
        letters = await read_topic(s, s.dlq_topic, 1)
        assert DeadLetter.from_record(None, letters[0][0], letters[0][1]).reason == "bad-layout"
        assert committer.client.get_reference(f"world-{world}").hash == head

        # Every table to the standard layout; sent twice (a redelivery): the second has nothing to do.
        evolve_all = layout_event("all", world, "all", spec="default", sort="default")
        await producer.send_and_wait(s.schema_topic, evolve_all)
        await producer.send_and_wait(s.schema_topic, evolve_all)
        answers = [orjson.loads(v) for v, _ in await read_topic(s, s.schema_answer_topic, 8)]
        statuses = [(a["table"], a["status"]) for a in answers[2:]]
        names = [t.name for t in ALL_TABLES]
        assert statuses == [(n, "applied") for n in names] + [(n, "unchanged") for n in names]
    finally:
        await producer.stop()

    def evolved() -> bool:
        return not cat_of(committer, world).load_table(("onto", COMMON.name)).spec().is_unpartitioned()

    await wait_for(evolved, what="the new spec on the branch")
    cat = cat_of(committer, world)
    for tdef in ALL_TABLES:
        table = cat.load_table(("onto", tdef.name))
        assert len(table.specs()) == 2
        assert table.metadata.properties.get("gc.enabled") == "false"
    assert objects(cat) == before, "evolution changed what readers see"
    writes_reads_and_rebuild_after_evolution(s, committer, world, first, before)
