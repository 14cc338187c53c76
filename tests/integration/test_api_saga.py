"""ApplyChanges (the direct-write saga) against the real Kafka, Nessie, Redis and a real worker process."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from api.saga import undo_id
from bench.api_load import ApiProcess, start_api
from tests.integration.pipeline import Pipeline

pytestmark = pytest.mark.integration


@pytest.fixture
async def pipe(unique: str, tmp_path: Path, kafka_bootstrap: str, nessie_url: str) -> AsyncIterator[Pipeline]:
    p = await Pipeline.create(unique, tmp_path, causal_timeout_s=120.0)
    yield p
    p.stop_all()


def _serve(pipe: Pipeline, **env: str) -> ApiProcess:
    settings = pipe.settings.replace(api_redis_prefix=f"causeway:api-test-{pipe.unique}", api_idempotency_ttl_s=900)
    return start_api(settings, pipe.tmp, extra_env=env)


def event(world: str, pk: str, change: str, version: int, before: dict | None = None, **after: object) -> str:
    return json.dumps(
        {
            "event_id": f"{world}-{pk}-{change}-{version}-{uuid.uuid4().hex[:6]}",
            "world_id": world,
            "object_type": "person",
            "object_pk": pk,
            "change_type": change,
            "before_properties": before,
            "after_properties": dict(after) if change != "DELETE" else None,
            "version": version,
            "occurred_at": 1_700_000_000_000,
        }
    )


async def _records(pipe: Pipeline) -> list[tuple[int, int, dict]]:
    """The objects topic's records as (Kafka timestamp in ms, offset, value)."""
    consumer = AIOKafkaConsumer(
        pipe.settings.objects_topic,
        bootstrap_servers=pipe.settings.kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        out: list[tuple[int, int, dict]] = []
        while batch := await consumer.getmany(timeout_ms=2000):
            out += [(r.timestamp, r.offset, json.loads(r.value)) for recs in batch.values() for r in recs]
        return out
    finally:
        await consumer.stop()


async def _topic(pipe: Pipeline) -> list[dict]:
    return [d for _, _, d in sorted(await _records(pipe), key=lambda x: (x[0], x[1]))]


async def _topic_at(pipe: Pipeline) -> list[tuple[int, dict]]:
    return [(ts, d) for ts, _, d in await _records(pipe)]


async def test_apply_changes_commits_and_reads_its_writes(pipe: Pipeline) -> None:
    pipe.start_worker()
    server = _serve(pipe)
    try:
        with server.client("admin") as c:
            world = f"s{pipe.unique[:8]}"
            c.create_world(world)
            events = [event(world, "a", "CREATE", 1, n=1), event(world, "a", "UPDATE", 2, {"n": 1}, n=2)]
            out = c.apply_changes(world, events, deadline_ms=60_000)
            assert out.status == "committed" and out.failed_step == "" and out.commit_hash
            # Read-your-writes: the returned commit holds both events.
            rows = [json.loads(o) for p in c.query_at(f"{world}@{out.commit_hash}") for o in p.objects_json]
            assert [(r["object_pk"], r["version"]) for r in rows] == [("a", 2)]
    finally:
        server.stop()


async def test_validate_step_fails_and_publishes_nothing(pipe: Pipeline) -> None:
    server = _serve(pipe)
    try:
        with server.client("admin") as c:
            world = f"s{pipe.unique[:8]}"
            c.create_world(world)
            bad = [
                event(world, "a", "CREATE", 1, n=1),
                event("other-world", "b", "CREATE", 1, n=1),
                event(world, "c", "UPDATE", 2, None, n=2),  # no before_properties: cannot be compensated
                '{"event_id": "x"}',
            ]
            out = c.apply_changes(world, bad, deadline_ms=5_000)
            assert (out.status, out.failed_step, out.compensated) == ("failed", "validate", 0)
            assert "event 1" in out.message and "event 2" in out.message and "event 3" in out.message
        assert await _topic(pipe) == []
    finally:
        server.stop()


async def test_publish_step_fails_and_what_went_out_is_compensated(pipe: Pipeline) -> None:
    # The server accepts 4 MiB events, the producer sends at most 1 MiB: the second publish fails for real.
    server = _serve(pipe, CAUSEWAY_MAX_EVENT_BYTES=str(4 * 1024 * 1024))
    try:
        with server.client("admin") as c:
            world = f"s{pipe.unique[:8]}"
            c.create_world(world)
            first = event(world, "a", "CREATE", 1, n=1)
            huge = event(world, "b", "CREATE", 1, blob="x" * 1_500_000)
            out = c.apply_changes(world, [first, huge], deadline_ms=5_000)
            assert (out.status, out.failed_step, out.compensated) == ("compensated", "publish", 1)
        sent = await _topic(pipe)
        first_id = json.loads(first)["event_id"]
        assert [(d["event_id"], d["change_type"], d["caused_by"]) for d in sent] == [
            (first_id, "CREATE", None),
            (undo_id(first_id), "DELETE", first_id),
        ]
    finally:
        server.stop()


async def test_wait_step_times_out_compensates_in_reverse_and_the_undo_applies(pipe: Pipeline) -> None:
    server = _serve(pipe)
    try:
        with server.client("admin") as c:
            world = f"s{pipe.unique[:8]}"
            c.create_world(world)
            events = [event(world, p, "CREATE", 1, n=i) for i, p in enumerate(("a", "b", "c"))]
            out = c.apply_changes(world, events, deadline_ms=1_500)  # no worker yet: the wait times out
            assert (out.status, out.failed_step, out.compensated) == ("compensated", "wait", 3)
            ids = [json.loads(e)["event_id"] for e in events]
            sent = [(d["event_id"], d["caused_by"]) for d in await _topic(pipe)]
            # Records of other keys sit on other partitions, so the topic's order is Kafka's timestamp
            # (ms): two sends in one millisecond tie. The order is checked by timestamps instead.
            assert sorted(sent) == sorted([(i, None) for i in ids] + [(undo_id(i), i) for i in ids])
            at = {d["event_id"]: ts for ts, d in await _topic_at(pipe)}
            assert max(at[i] for i in ids) <= min(at[undo_id(i)] for i in ids)  # every undo after every send
            undo_times = [at[undo_id(i)] for i in reversed(ids)]
            assert undo_times == sorted(undo_times)  # undone in reverse order
            pipe.start_worker()
            await pipe.wait_drained()
            live = [json.loads(o) for p in c.query_at(world) for o in p.objects_json]
            assert live == []  # each CREATE was applied, then undone by its compensation
            logged = [json.loads(e)["event_id"] for p in c.audit(world, "person", "a") for e in [p.json]]
            assert logged == [ids[0], undo_id(ids[0])]
    finally:
        server.stop()


async def test_compensate_step_fails_and_is_reported(pipe: Pipeline) -> None:
    """The topic stops accepting records this size while the saga waits: the compensation is refused for real."""
    server = _serve(pipe)
    try:
        with server.client("admin") as c:
            world = f"s{pipe.unique[:8]}"
            c.create_world(world)
            events = [event(world, "a", "CREATE", 1, blob="x" * 2000)]
            answer: list[object] = []
            call = threading.Thread(target=lambda: answer.append(c.apply_changes(world, events, deadline_ms=8_000)))
            call.start()
            while not await _topic(pipe):  # noqa: ASYNC110 - polls Kafka; published, no worker: the wait times out
                await asyncio.sleep(0.2)
            admin = AIOKafkaAdminClient(bootstrap_servers=pipe.settings.kafka_bootstrap)
            await admin.start()
            try:
                limit = {"max.message.bytes": "500"}
                await admin.alter_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, pipe.settings.objects_topic, limit)]
                )
            finally:
                await admin.close()
            await asyncio.to_thread(call.join)
            out = answer[0]
            assert (out.status, out.failed_step, out.compensated) == ("failed", "compensate", 0)  # type: ignore[attr-defined]
            assert "compensation failed after 0 of 1" in out.message  # type: ignore[attr-defined]
    finally:
        server.stop()
