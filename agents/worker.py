"""The worker process: a Faust app whose agent feeds the change applier and acks what it settled.

Faust pitfalls handled here (see the field notes): ``take()`` acks a batch even when the body
raised, so the agent uses ``noack_take`` and acks each event itself, only after its commit or dead
letter, in offset order per partition (the applier returns them that way). ``stream_wait_empty`` is
off, because a parked event is never acked until its cause arrives and must not stall a rebalance;
on revocation the applier first commits what it released, then drops what is parked (the new owner
re-reads it, and the branch's recorded offsets stop a second commit).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

import faust
from aiohttp.web import json_response

from agents.applier import Applier, RawRecord
from agents.deadletters import DeadLetterPublisher
from agents.marks import AppliedMarks
from models.worlds import WorldNaming
from monitoring import discovery
from monitoring.metrics import Metrics, add_metrics_page
from sinks.committer import BatchCommitter
from sinks.nessie import NessieClient
from sinks.readback import recent_event_ids
from streams.app import change_topics, create_app
from streams.settings import Settings
from streams.topics import ensure_topics
from worlds.manager import WorldManager

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25


class _Worlds:
    """World existence checks and creation for the applier, through the world manager."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client: NessieClient | None = None

    def _manager(self) -> WorldManager:
        if self._client is None:
            self._client = NessieClient.from_settings(self._settings)
        return WorldManager(self._client, WorldNaming(self._settings.prod_world, self._settings.main_branch))

    async def exists(self, world_id: str) -> bool:
        return await self._manager().get(world_id) is not None

    async def ensure(self, world_id: str) -> None:
        await self._manager().create(world_id)


def build_worker(settings: Settings, metrics: Metrics | None = None) -> tuple[faust.App, Applier]:
    """The Faust app with the applier agent, its timer, rebalance hook and /health page."""
    metrics = metrics or Metrics()
    app = create_app(settings)
    add_metrics_page(app, metrics)
    worker_id = f"{socket.gethostname()}-{os.getpid()}"
    naming = WorldNaming(settings.prod_world, settings.main_branch)
    applier = Applier(
        settings,
        marks=AppliedMarks.from_url(settings.redis_url, settings.dedupe_ttl_s),
        committer=BatchCommitter(settings, on_retry=metrics.commit_retry),
        dead_letters=DeadLetterPublisher(settings.kafka_bootstrap, settings.dlq_topic),
        worlds=_Worlds(settings),
        metrics=metrics,
        worker_id=worker_id,
        recent_event_ids=lambda world: asyncio.to_thread(recent_event_ids, settings, naming.branch(world)),
    )
    if settings.cdc_mapping:
        # CDC ingest runs in the same process when a mapping is configured, with the settings'
        # CAUSEWAY_CDC_* options; a bad mapping stops start-up with every problem listed
        # (MappingError), before any topic is created or record read.
        from agents.cdc import attach, load_cdc_mapping

        attach(app, settings, load_cdc_mapping(settings), metrics=metrics)
    # Schema sync (control-plane schema changes → Iceberg schema evolution per world branch) and the
    # periodic reconciliation run beside the applier, each with its own consumer group.
    from agents import reconcile, schema_sync

    schema_sync.attach(app, settings, metrics)
    reconcile.attach(app, settings, metrics, served=lambda: set(applier._known_worlds))  # noqa: SLF001
    from worlds import publish_timer  # periodic drift audit of worlds into prod (off by default)

    publish_timer.attach(app, settings, metrics.registry)
    topic = change_topics(app, settings)
    metrics.dead_letter_series(topic.topics)
    streams: list[Any] = []

    def current(event: Any) -> bool:
        """Whether a Faust event was fetched in the consumer group's current generation.

        A rebalance revokes every partition (eager protocol) and Faust then seeks each assigned
        partition back to its committed offset, so records fetched before it come again. Copies
        still buffered from the old generation are neither processed nor acked: acking them
        would put acks above offsets the new generation has not settled (Faust's commit would
        skip those), and processing them would feed the offset tracker a stale position.
        """
        generation = getattr(event.message, "generation_id", None)
        return generation is None or generation == app.consumer_generation_id

    async def ack(events: list[Any]) -> None:
        if not streams:
            return
        stream = streams[0]
        for event in events:
            if current(event):
                await stream.ack(event)

    @app.agent(topic, name="apply-changes", concurrency=1)
    async def apply_changes(stream: faust.StreamT) -> None:
        streams[:] = [stream]
        await applier.dlq.start()  # type: ignore[attr-defined]
        async for events in stream.noack_take(settings.batch_max_events, within=settings.batch_max_seconds):
            records = [
                RawRecord(
                    e.message.topic,
                    e.message.partition,
                    e.message.offset,
                    e.message.key,
                    e.message.value,
                    list(e.message.headers or []),
                    e,
                )
                for e in events
                if current(e)
            ]
            await ack(await applier.process(records))
            while applier.backpressure:
                # The gate is full: stop taking input until causes arrive or waits expire.
                await asyncio.sleep(TICK_SECONDS)
                await ack(await applier.tick())

    @app.task
    async def tick_loop() -> None:
        # A plain loop, not app.timer: a tick that flushes may take longer than the interval.
        while not app.should_stop:
            await asyncio.sleep(TICK_SECONDS)
            await ack(await applier.tick())

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        tps = [(tp.topic, tp.partition) for tp in revoked]
        await ack(await applier.flush_all())
        await applier.revoke(tps)

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        applier.on_assigned()

    @app.page("/health")
    async def health(web: Any, request: Any) -> Any:
        return json_response({"status": "ok", "worker": worker_id, **applier.summary()})

    @app.page("/summary")
    async def summary(web: Any, request: Any) -> Any:
        return json_response(applier.summary())

    return app, applier


def run_worker(settings: Settings) -> None:
    """Run one worker until stopped (SIGTERM/SIGINT); blocks."""
    app, _ = build_worker(settings)  # first: validates the CDC mapping before any topic is created
    asyncio.run(ensure_topics(settings))
    worker = faust.Worker(app, loglevel=settings.log_level.upper(), quiet=True)
    # Lag is measured outside the worker (monitoring.lag_exporter); Prometheus finds this worker's
    # /metrics through the discovery file it holds while it runs.
    target = discovery.advertised_address(settings.web_bind, settings.web_port)
    with discovery.registered(settings.prometheus_sd_dir, "worker", target):
        worker.execute_from_commandline()
