"""A real pipeline for tests: unique topics, group, branches and warehouse; worker *processes*.

Each Pipeline gets its own topics, consumer group, main branch (forked from Nessie's main), world
prefix and warehouse folder, so tests never see each other's data. Workers are `causeway worker`
subprocesses, so a test can kill -9 one and start another exactly as an operator would.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.procs import ROOT, Worker, free_port, start_worker, wait_healthy, worker_env
from cli.workload import Record, WorkloadParams, expected_state
from models.deadletter import DeadLetter
from models.events import ChangeEvent, EntityKind
from models.worlds import WorldNaming
from sinks.errors import NessieConflict
from sinks.nessie import NessieClient, Reference
from sinks.readback import BranchState, read_world
from streams.lag_probe import OffsetProbe
from streams.security import kafka_client_options
from streams.settings import Settings
from streams.topics import ensure_topics

__all__ = ["ROOT", "Pipeline", "Worker", "free_port"]

#: How often ``wait_drained`` asks the broker for the group's lag (two requests on kept connections).
DRAIN_POLL_S = 0.2


@dataclass
class Pipeline:
    unique: str
    tmp: Path
    settings: Settings
    env: dict[str, str]
    workers: list[Worker] = field(default_factory=list)
    direct_nessie_url: str = ""  # Nessie itself, also when the worker's URL is a test's cuttable proxy
    made_worlds: set[str] = field(default_factory=set)  # by create_worlds: later publishes need no Nessie

    @classmethod
    async def create(cls, unique: str, tmp: Path, **overrides: object) -> Pipeline:
        base = Settings.from_env()
        values: dict[str, object] = {
            "app_id": f"cw-{unique}",
            "objects_topic": f"objs.{unique}",
            "links_topic": f"links.{unique}",
            "dlq_topic": f"dlq.{unique}",
            "main_branch": f"main-{unique}",
            "warehouse": f"file://{tmp}/warehouse",
            "unknown_world_policy": "create",
            "batch_max_events": 500,
            "batch_max_seconds": 0.5,
            "causal_timeout_s": 60.0,
            "session_timeout_s": 6.0,  # the broker's minimum: killed workers' partitions move fast
        }
        values.update(overrides)
        settings = base.replace(**values)
        env = worker_env(settings)
        await ensure_topics(settings)
        # Start from Nessie's empty root, not main: main may hold the demo's data.
        await _branches_from_empty_root(settings, [settings.main_branch], exist_ok=False)
        return cls(unique, tmp, settings, env, direct_nessie_url=base.nessie_url)

    async def create_worlds(self, worlds: set[str]) -> None:
        """Branches from Nessie's empty root for the worlds that have none (prod is the main branch)."""
        worlds = worlds - {self.settings.prod_world} - self.made_worlds
        if not worlds:
            return
        naming = WorldNaming(self.settings.prod_world, self.settings.main_branch)
        # Nessie itself: an outage test may have cut the worker's proxy before publishing.
        direct = self.settings.replace(nessie_url=self.direct_nessie_url or self.settings.nessie_url)
        # An earlier publish or another test's run may have made some: those are kept.
        await _branches_from_empty_root(direct, [naming.branch(w) for w in sorted(worlds)], exist_ok=True)
        self.made_worlds |= worlds

    def params(self, **kw: object) -> WorkloadParams:
        """Workload parameters whose worlds and event ids belong to this pipeline only."""
        defaults: dict[str, object] = {"world_prefix": f"t{self.unique[:8]}-", "id_prefix": f"{self.unique}-"}
        defaults.update(kw)
        return WorkloadParams(**defaults)  # type: ignore[arg-type]

    # --- workers --------------------------------------------------------------------------------

    def start_worker(self, fault: str | None = None, wait: bool = True, port: int | None = None) -> Worker:
        """Start a worker process; ``port`` (default: any free one) serves its /health and /metrics."""
        port = port or free_port()
        log = self.tmp / f"worker-{len(self.workers)}-{port}.log"
        worker = start_worker(self.env, log, fault=fault, wait=False, port=port)
        self.workers.append(worker)
        if wait:
            wait_healthy(worker)
        return worker

    def kill(self, worker: Worker, sig: int = signal.SIGKILL) -> None:
        if worker.alive():
            worker.proc.send_signal(sig)
        worker.proc.wait(timeout=60)

    def stop_all(self) -> None:
        for w in self.workers:
            if w.alive():
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    # --- Kafka ----------------------------------------------------------------------------------

    def topic_of(self, kind: EntityKind) -> str:
        return self.settings.objects_topic if kind is EntityKind.OBJECT else self.settings.links_topic

    async def publish(self, records: list[Record], create_worlds: bool = True) -> None:
        """Send the records; under the 'create' policy, first give each new world an empty branch.

        The model (``expected_state``) starts every world empty, but a world the worker creates
        forks the main branch as it is at that moment: when the prod world's first commit landed
        before another world's first event was read, that world would hold prod's rows too (seen
        once in CI). Creating the branches here makes the outcome independent of timing;
        ``test_an_unknown_world_is_forked_from_main_when_first_seen`` covers the policy itself.
        """
        if create_worlds and self.settings.unknown_world_policy == "create":
            await self.create_worlds({r.event.world_id for r in records if r.event is not None})
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap, linger_ms=5, **kafka_client_options(self.settings)
        )
        await producer.start()
        try:
            for r in records:
                await producer.send(self.topic_of(r.kind), r.value, key=r.key)
            await producer.flush()
        finally:
            await producer.stop()

    async def publish_raw(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap, **kafka_client_options(self.settings)
        )
        await producer.start()
        try:
            await producer.send_and_wait(topic, value, key=key, headers=headers)
        finally:
            await producer.stop()

    async def lag(self, probe: OffsetProbe | None = None) -> int:
        """Sum over the change topics' partitions of end offset − the group's committed offset.

        ``probe``: one kept across calls (``wait_drained``'s); None opens and closes one for this call.
        """
        s = self.settings
        kept = probe or OffsetProbe(s.kafka_bootstrap, kafka_options=kafka_client_options(s))
        try:
            return sum((await kept.group_lag(s.app_id, (s.objects_topic, s.links_topic))).values())
        finally:
            if probe is None:
                await kept.close()

    async def wait_drained(self, timeout: float = 120) -> None:  # noqa: ASYNC109 - a deadline, not a cancel
        """Until the group's committed offsets reach the end of every change partition."""
        deadline = time.monotonic() + timeout
        lag = -1
        # One pair of clients for the whole wait: a pair per poll bootstrapped twice every poll.
        probe = OffsetProbe(self.settings.kafka_bootstrap, kafka_options=kafka_client_options(self.settings))
        try:
            while time.monotonic() < deadline:
                lag = await self.lag(probe)
                if lag == 0:
                    return
                await asyncio.sleep(DRAIN_POLL_S)
        finally:
            await probe.close()
        logs = "\n".join(f"--- {w.log.name}\n{w.log.read_text()[-2000:]}" for w in self.workers)
        raise AssertionError(f"not drained after {timeout}s (lag {lag}); worker logs:\n{logs}")

    async def dead_letters(self) -> list[DeadLetter]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            enable_auto_commit=False,
            **kafka_client_options(self.settings),
        )
        await consumer.start()
        try:
            tp = TopicPartition(self.settings.dlq_topic, 0)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            consumer.seek(tp, 0)
            out: list[DeadLetter] = []
            while len(out) < end:
                batch = await consumer.getmany(tp, timeout_ms=2000)
                records = batch.get(tp, [])
                if not records:
                    break
                out.extend(DeadLetter.from_record(r.key, r.value, list(r.headers)) for r in records)
            return out
        finally:
            await consumer.stop()

    def state(self, world: str) -> BranchState:
        return read_world(self.settings, world)


def assert_matches_model(pipe: Pipeline, events: list[ChangeEvent]) -> None:
    for world, want in expected_state(events).items():
        got = pipe.state(world)
        assert not got.duplicate_event_ids, f"{world}: duplicate events {got.duplicate_event_ids[:5]}"
        assert set(got.event_ids) == want.event_ids, (
            f"{world}: event log differs: missing {sorted(want.event_ids - set(got.event_ids))[:5]}, "
            f"extra {sorted(set(got.event_ids) - want.event_ids)[:5]}"
        )
        assert got.objects == want.objects, f"{world}: entity_common differs from the model"
        assert got.links == want.links, f"{world}: entity_edge differs from the model"


async def _branches_from_empty_root(settings: Settings, names: list[str], *, exist_ok: bool) -> None:
    """Branches ``names`` from Nessie's empty root (not main, which may hold other data)."""
    async with NessieClient.from_settings(settings) as nessie:
        root = Reference("main", "BRANCH", (await nessie.config()).no_ancestor_hash)
        for name in names:
            try:
                await nessie.create_branch(name, root)
            except NessieConflict:
                if not exist_ok:
                    raise
