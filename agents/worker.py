"""The worker process: a Faust app that runs the change intake and the applier as a service.

The change topics are read by :class:`agents.intake.ChangeIntake`, an aiokafka ``getmany`` loop in
the consumer group ``app_id`` that owns its offsets (commits only what the offset tracker says is
settled, in order; drops records polled before a rebalance). Faust keeps the rest: the web server
(/metrics, /health), the service tree and lifecycle, the timers (reconciliation) and the
control-plane loops. Faust's own consumer joins the group ``<app_id>-faust`` (its leader topic
only), so it never competes with the intake for the change topics. Why the change topics left
Faust's per-message path: docs/architecture.md, "Intake by batches".
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import time
from typing import Any

import faust
from aiohttp.web import json_response

from agents.applier import Applier
from agents.deadletter_publisher import DeadLetterPublisher
from agents.intake import ChangeIntake
from agents.intake import attach as attach_intake
from agents.marks import AppliedMarks, DeadLetterMarks
from agents.probes import dependency_watcher
from models.worlds import WorldNaming
from monitoring import discovery
from monitoring.health import CounterMeter, Health, meter_method, status_probe
from monitoring.metrics import Metrics, add_metrics_page
from sinks.committer import BatchCommitter
from sinks.nessie import NessieClient
from sinks.readback import recent_event_ids
from streams import memory
from streams.app import create_app
from streams.security import kafka_client_options, redis_options
from streams.settings import Settings, native_pool_env
from streams.topics import ensure_topics
from worlds.manager import WorldManager

log = logging.getLogger(__name__)

LOOP_STALL_S = 120.0  # a polling loop that completes no poll for this long is stuck (docs/operations.md)


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
    """The Faust app with the change intake and applier, the lag timer and the /health page."""
    metrics = metrics or Metrics()
    # Faust's consumer group must differ from the intake's (``app_id``): the two would otherwise
    # join one group with incompatible assignors.
    app = create_app(settings.replace(app_id=f"{settings.app_id}-faust"))
    add_metrics_page(app, metrics)
    worker_id = f"{socket.gethostname()}-{os.getpid()}"
    health = Health()
    naming = WorldNaming(settings.prod_world, settings.main_branch)
    applier = Applier(
        settings,
        marks=AppliedMarks.from_settings(settings, **redis_options(settings)),
        committer=BatchCommitter(settings, on_retry=metrics.commit_retry),
        dead_letters=DeadLetterPublisher(settings.kafka_bootstrap, settings.dlq_topic, kafka_client_options(settings)),
        worlds=_Worlds(settings),
        metrics=metrics,
        worker_id=worker_id,
        recent_event_ids=lambda world: asyncio.to_thread(recent_event_ids, settings, naming.branch(world)),
        pipelined=True,
        dead_marks=DeadLetterMarks.from_url(settings.redis_url, settings.dedupe_ttl_s, **redis_options(settings)),
        cpu_clock=time.process_time,
    )
    if settings.cdc_mapping:
        # CDC ingest runs in the same process when a mapping is configured, with the settings'
        # CAUSEWAY_CDC_* options; a bad mapping stops start-up with every problem listed
        # (MappingError), before any topic is created or record read.
        from agents.cdc import attach
        from cdc.mapping_loader import load_cdc_mapping

        ingest = attach(app, settings, load_cdc_mapping(settings), metrics=metrics)
        # The ingest's own status (last commit, records waiting) when it has one; else completed polls.
        probe = status_probe(ingest.status) if hasattr(ingest, "status") else meter_method(ingest).progress
        health.register_loop("cdc-ingest", probe, LOOP_STALL_S)
    # Schema sync (control-plane schema changes → Iceberg schema evolution per world branch) and the
    # periodic reconciliation run beside the applier, each with its own consumer group.
    from agents import reconcile, schema_sync

    health.register_loop("schema-sync", meter_method(schema_sync.attach(app, settings, metrics)).progress, LOOP_STALL_S)
    reconciler = reconcile.attach(app, settings, metrics, served=lambda: set(applier._known_worlds))  # noqa: SLF001
    # The timer reads the last run back every few seconds, passes or not: a timer that stops doing so is stuck.
    stall = reconciler.readback_interval_s + LOOP_STALL_S
    health.register_loop("reconcile-timer", meter_method(reconciler, "readback").progress, stall)
    from worlds import publish_timer  # periodic drift audit of worlds into prod (off by default)

    publish_timer.attach(app, settings, metrics.registry)
    metrics.dead_letter_series([settings.objects_topic, settings.links_topic])
    attach_intake(app, ChangeIntake(settings, applier, metrics))

    # Intake: stuck when consumed records wait unsettled for longer than a cause may be waited for.
    intake = CounterMeter(lambda: _settled(applier.totals), lambda: applier.tracker.in_flight())
    health.register_loop("intake", intake.progress, settings.causal_timeout_s + LOOP_STALL_S)

    app.task(dependency_watcher(health, settings, lambda: app.should_stop))

    def health_page(live_only: bool) -> Any:
        report = health.report()
        ok = report.live if live_only else report.ready
        body = report.to_json() | {"worker": worker_id, **applier.summary()}
        return json_response(body, status=200 if ok else 503)

    @app.page("/health")
    async def health_ready(web: Any, request: Any) -> Any:
        return health_page(live_only=False)

    @app.page("/health/ready")
    async def ready(web: Any, request: Any) -> Any:
        return health_page(live_only=False)

    @app.page("/health/live")
    async def live(web: Any, request: Any) -> Any:
        return health_page(live_only=True)

    @app.page("/summary")
    async def summary(web: Any, request: Any) -> Any:
        return json_response(applier.summary())

    return app, applier


#: Generation-0 threshold of the cyclic garbage collector in a worker. The hot path allocates a
#: few dicts and dataclasses per event and frees them by reference counting; with the default
#: (700) the collector ran every few hundred events and scanned every live in-flight event: a
#: cProfile replay of 50k small-profile records through the applier (services stubbed) took
#: 45-50 us of CPU per event with the default and 34-35 with this (docs/benchmarks.md).
GC_THRESHOLD = (100_000, 50, 100)


def _settled(totals: dict[str, int]) -> int:
    return totals.get("applied", 0) + totals.get("dead_lettered", 0) + totals.get("duplicates", 0)


def run_worker(settings: Settings) -> None:
    """Run one worker until stopped (SIGTERM/SIGINT); blocks."""
    gc.set_threshold(*GC_THRESHOLD)
    # Process-wide allocator knobs: before any thread allocates (an arena cap binds new threads only).
    applied = memory.configure(settings.memory_pool, settings.malloc_arena_max)
    wanted = native_pool_env(settings.arrow_cpp_pool)
    if wanted is not None and applied.native != wanted:
        log.warning(
            "Arrow's C++ code allocates from %s, not %s (CAUSEWAY_ARROW_CPP_POOL): pyarrow loaded before "
            "causeway could choose its pool, or ARROW_DEFAULT_MEMORY_POOL names another one",
            applied.native,
            wanted,
        )
    memory.Releaser(settings.memory_release_interval_s).start()
    app, _ = build_worker(settings)  # first: validates the CDC mapping before any topic is created
    asyncio.run(ensure_topics(settings))
    worker = faust.Worker(app, loglevel=settings.log_level.upper(), quiet=True)
    # Lag is measured outside the worker (monitoring.lag_exporter); Prometheus finds this worker's
    # /metrics through the discovery file it holds while it runs.
    target = discovery.advertised_address(settings.web_bind, settings.web_port)
    with discovery.registered(settings.prometheus_sd_dir, "worker", target):
        worker.execute_from_commandline()
