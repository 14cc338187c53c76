"""CDC ingest: Debezium records on ``cdc.raw.*`` → change events on ``onto.changes.*``.

Why an aiokafka loop and not a Faust agent: the ingest must commit a partition's offset only after
every record up to it was produced (to a change topic or the DLQ) and acknowledged by the broker.
A Faust agent acks an event when the agent moves past it (``take()`` acks a batch even when its body
fails), which can commit offsets whose output was never written. The loop here owns its offsets:

1. ``getmany`` a batch (up to ``max_records``) from every assigned ``cdc.raw.*`` partition;
2. convert it in memory (``plan_batch``: orjson + the pure mapping, no I/O);
3. hand every output record to the producer without waiting (``send`` only enqueues; batching and
   ``linger_ms`` make it a few requests per batch, never a round trip per record);
4. wait for all the produce futures; only then commit ``last offset + 1`` per partition.

At-least-once: a crash between 3 and 4 re-reads the batch and produces the same events (same
``event_id``, deterministic), which the applier dedupes. If a produce fails, nothing is committed and
the consumer seeks back to the batch's first offsets, then retries after a pause.

Pattern subscription picks up topics created after start-up at the next metadata refresh, so
``metadata_max_age_ms`` bounds how long a new ``cdc.raw.<source>.<table>`` waits (default 5 s; the
Kafka default is 5 minutes). New topics are read from the earliest offset.

It runs in its own consumer group (``<app_id>-cdc``) either standalone (``run_forever``) or inside the
Faust worker (``attach(app, ...)`` starts and stops it with the app).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from agents.cdc_mapping import CdcMapping, Converted, Ignored, Position, convert, mapping_from_env
from agents.kafka_loop import KafkaLoop
from models.deadletter import DeadLetter
from models.events import EntityKind
from streams.security import kafka_client_options
from streams.settings import Settings
from streams.topics import ensure_topics

log = logging.getLogger(__name__)

DEFAULT_PATTERN = r"^cdc\.raw\..*"


@dataclass(frozen=True)
class IngestOptions:
    """Ingest tunables (env ``CAUSEWAY_CDC_<NAME>``); candidates to move into streams.settings."""

    pattern: str = DEFAULT_PATTERN  # topics to subscribe
    group_id: str = ""  # consumer group; empty means "<app_id>-cdc"
    metadata_max_age_ms: int = 5_000  # how soon a new cdc.raw.* topic is noticed
    max_records: int = 5_000  # records per poll (one batch)
    poll_timeout_ms: int = 500
    linger_ms: int = 5  # producer batching delay
    dlq_max_value_bytes: int = 900_000  # a larger rejected value goes to the DLQ without its bytes
    retry_backoff_s: float = 1.0  # pause before re-reading a batch whose produce failed
    ensure_topics: bool = True  # create the change and DLQ topics if missing

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> IngestOptions:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(f"CAUSEWAY_CDC_{f.name.upper()}")
            if raw is None:
                continue
            default: Any = f.default
            if isinstance(default, bool):
                values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
            else:
                values[f.name] = type(default)(raw)
        values.update(overrides)
        return cls(**values)


class RawRecord(Protocol):
    """What the planner needs of a consumed record (aiokafka's ConsumerRecord has it)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Outgoing:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


@dataclass
class BatchPlan:
    """What one batch produces, and what it counted."""

    outgoing: list[Outgoing] = field(default_factory=list)
    events: int = 0
    ignored: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    commit: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, partition) → next offset


def plan_batch(
    records: Iterable[RawRecord],
    mapping: CdcMapping,
    settings: Settings,
    now_ms: int,
    dlq_max_value_bytes: int = 900_000,
) -> BatchPlan:
    """Convert a batch of raw records into the records to produce; pure (``now_ms`` is passed in)."""
    plan = BatchPlan()
    topic_for = {EntityKind.OBJECT: settings.objects_topic, EntityKind.LINK: settings.links_topic}
    for rec in records:
        pos = Position(rec.topic, rec.partition, rec.offset)
        result = convert(rec.value, mapping, pos, settings.max_event_bytes)
        tp = (rec.topic, rec.partition)
        plan.commit[tp] = max(plan.commit.get(tp, 0), rec.offset + 1)
        if isinstance(result, Converted):
            for ev in result.events:
                plan.outgoing.append(Outgoing(topic_for[ev.event.kind], ev.key, ev.value))
            plan.events += len(result.events)
        elif isinstance(result, Ignored):
            plan.ignored[result.kind] += 1
        else:
            value, detail = rec.value, result.detail
            if value is not None and len(value) > dlq_max_value_bytes:
                detail = (
                    f"{detail} (value of {len(value)} bytes omitted; re-read it from "
                    f"{rec.topic}/{rec.partition}@{rec.offset})"
                )
                value = None
            dl = DeadLetter(
                reason=result.reason,
                detail=detail,
                topic=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
                key=rec.key,
                value=value,
                event_id=result.event_id,
                world_id=result.world_id,
                first_seen_ms=now_ms,
                original_headers=list(rec.headers or ()),
            )
            plan.dead_letters.append(dl)
            plan.rejected[result.reason] += 1
            plan.outgoing.append(Outgoing(settings.dlq_topic, dl.key, dl.value, dl.headers()))
    return plan


@dataclass
class IngestStats:
    consumed: int = 0
    events: int = 0
    batches: int = 0
    commits: int = 0
    commit_failures: int = 0
    produce_failures: int = 0
    ignored: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)


class _Metrics(Protocol):
    def consumed(self, topic: str, n: int = 1) -> None: ...
    def dead_lettered(self, topic: str, reason: str, *, world: str | None = None, n: int = 1) -> None: ...


class _Revoke(ConsumerRebalanceListener):  # type: ignore[misc]
    """Let an in-flight batch finish (produce + commit) before partitions move to another worker."""

    def __init__(self, lock: asyncio.Lock) -> None:
        self._lock = lock

    async def on_partitions_revoked(self, revoked: Any) -> None:
        async with self._lock:
            pass

    async def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("cdc ingest assigned %d partitions", len(assigned))


class CdcIngest(KafkaLoop):
    """The ingest loop. ``start`` → ``run`` (until ``stop``) → closed; or ``async with``."""

    name = "cdc ingest"
    retry_on = (KafkaError, IllegalStateError)

    @property
    def retry_pause_s(self) -> float:
        return self.options.retry_backoff_s

    def __init__(
        self,
        settings: Settings,
        mapping: CdcMapping,
        options: IngestOptions | None = None,
        metrics: _Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.mapping = mapping
        self.options = options or IngestOptions()
        self.metrics = metrics
        self.stats = IngestStats()
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None

    @property
    def group_id(self) -> str:
        return self.options.group_id or f"{self.settings.app_id}-cdc"

    async def start(self) -> None:
        bootstrap = self.settings.kafka_bootstrap
        if self.options.ensure_topics:
            await ensure_topics(self.settings)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=self.options.linger_ms,
            max_request_size=max(self.settings.max_event_bytes, self.options.dlq_max_value_bytes) + 65_536,
            **kafka_client_options(self.settings),
        )
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            metadata_max_age_ms=self.options.metadata_max_age_ms,
            isolation_level="read_committed",
            max_partition_fetch_bytes=max(1_048_576, self.settings.max_event_bytes * 2),
            **kafka_client_options(self.settings),
        )
        await self._producer.start()
        try:
            self._consumer.subscribe(pattern=self.options.pattern, listener=_Revoke(self._lock))
            await self._consumer.start()
        except BaseException:
            await self._producer.stop()
            raise
        log.info("cdc ingest started: group %s, pattern %s", self.group_id, self.options.pattern)

    def stop_soon(self) -> None:
        """Ask ``run`` to return after the current batch."""
        self._stopping.set()

    async def step(self) -> int:
        """Poll, convert, produce, commit one batch; returns how many records it consumed."""
        consumer, producer = self._consumer, self._producer
        if consumer is None or producer is None:
            if self._stopping.is_set():
                return 0
            raise RuntimeError("CdcIngest.start() first")
        batches = await consumer.getmany(timeout_ms=self.options.poll_timeout_ms, max_records=self.options.max_records)
        if not batches:
            return 0
        async with self._lock:
            # A rebalance may have run between the poll and the lock: drop what is no longer ours.
            assigned = consumer.assignment()
            records = [r for tp, rs in batches.items() if tp in assigned for r in rs]
            if not records:
                return 0
            plan = plan_batch(
                records,
                self.mapping,
                self.settings,
                int(time.time() * 1000),
                self.options.dlq_max_value_bytes,
            )
            try:
                futures = [await producer.send(o.topic, o.value, key=o.key, headers=o.headers) for o in plan.outgoing]
                await asyncio.gather(*futures)
            except KafkaError as exc:
                self.stats.produce_failures += 1
                log.warning("cdc ingest: produce failed, re-reading the batch: %r", exc)
                for tp, rs in batches.items():
                    if tp in assigned and rs:
                        consumer.seek(tp, rs[0].offset)
                await asyncio.sleep(self.options.retry_backoff_s)
                return 0
            offsets = {TopicPartition(t, p): off for (t, p), off in plan.commit.items()}
            try:
                await consumer.commit(offsets)
                self.stats.commits += 1
            except (CommitFailedError, IllegalStateError) as exc:
                # The partitions moved during the batch; their new owner re-reads and dedupe absorbs it.
                self.stats.commit_failures += 1
                log.warning("cdc ingest: commit failed after a rebalance: %r", exc)
        self._count(records, plan)
        return len(records)

    def _count(self, records: list[Any], plan: BatchPlan) -> None:
        s = self.stats
        s.consumed += len(records)
        s.events += plan.events
        s.batches += 1
        s.ignored.update(plan.ignored)
        s.rejected.update(+plan.rejected)
        if self.metrics is not None:
            per_topic = Counter(r.topic for r in records)
            for topic, n in per_topic.items():
                self.metrics.consumed(topic, n)
            for dl in plan.dead_letters:
                self.metrics.dead_lettered(dl.topic, dl.reason, world=dl.world_id)


async def run_forever(
    settings: Settings | None = None,
    mapping: CdcMapping | None = None,
    options: IngestOptions | None = None,
) -> None:
    """Standalone entry point: settings, mapping and options from the environment."""
    settings = settings or Settings.from_env()
    mapping = mapping or mapping_from_env()  # validated before anything connects
    ingest = CdcIngest(settings, mapping, options or IngestOptions.from_env())
    await ingest.start()
    try:
        await ingest.run()
    finally:
        await ingest.stop()


def attach(app: Any, settings: Settings, mapping: CdcMapping, **kwargs: Any) -> CdcIngest:
    """Run the ingest inside a Faust worker: started after the app starts, stopped with it."""
    from mode import Service

    ingest = CdcIngest(settings, mapping, **kwargs)

    class CdcIngestService(Service):  # type: ignore[misc]
        async def on_start(self) -> None:
            await ingest.start()
            self.add_future(ingest.run())

        async def on_stop(self) -> None:
            await ingest.stop()

    app.add_dependency(CdcIngestService())
    return ingest


def main() -> None:
    """``python -m agents.cdc``: the ingest alone, configured from ``CAUSEWAY_*`` variables."""
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run_forever(settings))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
