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

Size limits: a record the broker would refuse (its key, value and headers over the target topic's
``max.message.bytes``, read at start-up) never reaches the producer: its raw record is dead-lettered
as ``event-too-large`` and the batch goes on. Should the broker refuse one anyway (the topic's limit
was lowered since), the producer is rebuilt and the batch is produced again one record at a time;
a record refused on its own is dead-lettered the same way. Nothing wedges the loop.

Pattern subscription picks up topics created after start-up at the next metadata refresh, so
``metadata_max_age_ms`` bounds how long a new ``cdc.raw.<source>.<table>`` waits (default 5 s; the
Kafka default is 5 minutes). New topics are read from the earliest offset.

It runs in its own consumer group (``<app_id>-cdc``) either standalone (``run_forever``) or inside the
Faust worker (``attach(app, ...)`` starts and stops it with the app). Its tunables are the ``cdc_*``
fields of the one settings object (``CAUSEWAY_CDC_*``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError, MessageSizeTooLargeError
from redis.exceptions import RedisError

from agents.deadletter_publisher import decisions_from_settings
from agents.kafka_loop import KafkaLoop
from agents.letter_marks import Decisions, letter_key
from cdc.mapping import CdcMapping, MappingError
from cdc.mapping_loader import load_cdc_mapping
from cdc.plan import (
    TOO_LARGE,
    BatchPlan,
    IngestStats,
    IngestStatus,
    Outgoing,
    counters_line,
    limit_warnings,
    plan_batch,
    unchecked_world_warning,
)
from models.deadletter import DeadLetter
from streams.security import kafka_client_options
from streams.settings import Settings, SettingsError
from streams.topics import MESSAGE_HEADROOM_BYTES, ensure_topics, message_bytes_needed

log = logging.getLogger(__name__)


class _Metrics(Protocol):
    def consumed(self, topic: str, n: int = 1) -> None: ...
    def dead_lettered(self, topic: str, reason: str, *, world: str | None = None, n: int = 1) -> None: ...
    def cdc_batch(
        self, *, skipped: Mapping[str, int], events: int, failures: Mapping[str, int], committed_at: float | None
    ) -> None: ...
    def cdc_waiting_records(self, n: int) -> None: ...


class _Revoke(ConsumerRebalanceListener):
    """Let an in-flight batch finish (produce + commit) before partitions move to another worker."""

    def __init__(self, lock: asyncio.Lock) -> None:
        self._lock = lock

    async def on_partitions_revoked(self, revoked: Any) -> None:
        async with self._lock:
            pass

    async def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("cdc ingest assigned %d partitions", len(assigned))


async def topic_limits(
    bootstrap: str, topics: Sequence[str], kafka_options: dict[str, Any] | None = None
) -> dict[str, int]:
    """``max.message.bytes`` of each existing topic (missing topics are left out)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(kafka_options or {}))
    await admin.start()
    try:
        wanted = [ConfigResource(ConfigResourceType.TOPIC, t, {"max.message.bytes": None}) for t in topics]
        out: dict[str, int] = {}
        for response in await admin.describe_configs(wanted):
            for error_code, _msg, _type, name, entries in response.resources:
                for entry in entries if error_code == 0 else ():
                    if entry[0] == "max.message.bytes":
                        out[name] = int(entry[1])
        return out
    finally:
        await admin.close()


class CdcIngest(KafkaLoop):
    """The ingest loop. ``start`` → ``run`` (until ``stop``) → closed; or ``async with``."""

    name = "cdc ingest"
    retry_on = (KafkaError, IllegalStateError)

    @property
    def retry_pause_s(self) -> float:
        return self.settings.cdc_retry_backoff_s

    def __init__(
        self,
        settings: Settings,
        mapping: CdcMapping,
        metrics: _Metrics | None = None,
        decisions: Decisions | None = None,
    ) -> None:
        self.settings = settings
        #: Dead-letter decisions shared with the applier (``agents.letter_marks.Decisions``): a raw
        #: record dead-lettered before a crash (offset not committed yet) gets no second letter.
        self.decisions = decisions
        self.mapping = mapping
        self.metrics = metrics
        self.stats = IngestStats()
        #: topic → the largest record (bytes) it accepts: min(max.message.bytes, the producer's max)
        self.limits: dict[str, int] = {}
        self.started_at: float | None = None
        self.last_commit_at: float | None = None
        self.last_failure: str | None = None
        self._committed: dict[TopicPartition, int] = {}
        self._warned_unchecked: set[str] = set()
        self._fetched_from: dict[TopicPartition, int] = {}
        self._logged_at = time.monotonic()
        self._logged = IngestStats()
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None

    @property
    def group_id(self) -> str:
        return self.settings.cdc_group_id or f"{self.settings.app_id}-cdc"

    @property
    def max_request_bytes(self) -> int:
        return max(self.settings.max_event_bytes, self.settings.cdc_dlq_max_value_bytes) + MESSAGE_HEADROOM_BYTES

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=self.settings.cdc_linger_ms,
            max_request_size=self.max_request_bytes,
            **kafka_client_options(self.settings),
        )

    async def refresh_limits(self) -> None:
        """Read the output topics' ``max.message.bytes``; warn about those below what causeway needs."""
        s = self.settings
        needed = message_bytes_needed(s)
        outputs = [s.objects_topic, s.links_topic, s.dlq_topic]
        try:
            found = await topic_limits(s.kafka_bootstrap, outputs, kafka_client_options(s))
        except KafkaError as exc:  # e.g. no DescribeConfigs permission: fall back to the broker's refusals
            log.warning("cdc ingest: cannot read the topics' max.message.bytes: %r", exc)
            found = {}
        for line in limit_warnings(found, needed):
            log.warning("cdc ingest: %s", line)
        self.limits = {t: min(found.get(t, sys.maxsize), self.max_request_bytes) for t in outputs}

    async def start(self) -> None:
        if self.settings.cdc_ensure_topics:
            await ensure_topics(self.settings)
        await self.refresh_limits()
        self._producer = self._new_producer()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            metadata_max_age_ms=self.settings.cdc_metadata_max_age_ms,
            isolation_level="read_committed",
            max_partition_fetch_bytes=max(1_048_576, self.settings.max_event_bytes * 2),
            **kafka_client_options(self.settings),
        )
        await self._producer.start()
        try:
            self._consumer.subscribe(pattern=self.settings.cdc_pattern, listener=_Revoke(self._lock))
            await self._consumer.start()
        except BaseException:
            await self._producer.stop()
            raise
        self.started_at = time.time()
        log.info("cdc ingest started: group %s, pattern %s", self.group_id, self.settings.cdc_pattern)

    def stop_soon(self) -> None:
        """Ask ``run`` to return after the current batch."""
        self._stopping.set()

    def status(self) -> IngestStatus:
        """Last commit time, records waiting and the last failure (see ``IngestStatus``)."""
        return IngestStatus(self.started_at, self.last_commit_at, self.records_waiting(), self.last_failure)

    def records_waiting(self) -> int:
        """Raw records on the assigned partitions not yet committed, as of the last fetch."""
        consumer = self._consumer
        if consumer is None:
            return 0
        waiting = 0
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is None:
                continue
            # Before this process's first commit of a partition: from the first offset it fetched.
            done = self._committed.get(tp, self._fetched_from.get(tp))
            if done is not None:
                waiting += max(0, high - done)
        return waiting

    async def step(self) -> int:
        """Poll, convert, produce, commit one batch; returns how many records it consumed."""
        consumer, producer = self._consumer, self._producer
        if consumer is None or producer is None:
            if self._stopping.is_set():
                return 0
            raise RuntimeError("CdcIngest.start() first")
        batches = await consumer.getmany(
            timeout_ms=self.settings.cdc_poll_timeout_ms, max_records=self.settings.cdc_max_records
        )
        if not batches:
            self._export_waiting()
            return 0
        async with self._lock:
            if self._consumer is None:
                return 0  # stopped while the poll ran
            # A rebalance may have run between the poll and the lock: drop what is no longer ours.
            assigned = consumer.assignment()
            records = [r for tp, rs in batches.items() if tp in assigned for r in rs]
            if not records:
                return 0
            for tp, rs in batches.items():
                if rs and tp not in self._fetched_from:
                    self._fetched_from[tp] = rs[0].offset
            plan = self._plan(records)
            decided: set[str] = set()
            known: set[str] = set()
            keys = await self._decide_letters(plan, decided, known)
            sent: list[tuple[Outgoing, asyncio.Future[Any]]] = []
            try:
                try:
                    await self._produce(producer, plan.outgoing, sent)
                except MessageSizeTooLargeError as exc:
                    # The broker refused a record the limits let through: go record by record.
                    self._failed("broker-refused", exc)
                    # Letters the broker took from the refused batch are not sent a second time.
                    decided |= await self._letters_delivered(sent)
                    plan, more = await self._produce_one_by_one(records, decided, known)
                    keys += more
            except KafkaError as exc:
                self._failed("produce", exc)
                log.warning("cdc ingest: produce failed, re-reading the batch: %r", exc)
                for tp, rs in batches.items():
                    if tp in assigned and rs:
                        consumer.seek(tp, rs[0].offset)
                await asyncio.sleep(self.settings.cdc_retry_backoff_s)
                self._record(None)
                return 0
            if self.decisions is not None and keys:
                await self._decision_call(self.decisions.published(keys))
            offsets = {TopicPartition(t, p): off for (t, p), off in plan.commit.items()}
            committed_at: float | None = None
            try:
                await consumer.commit(offsets)
                self.stats.commits += 1
                committed_at = self.last_commit_at = time.time()
                self._committed.update(offsets)
                self.last_failure = None
            except (CommitFailedError, IllegalStateError) as exc:
                # The partitions moved during the batch; their new owner re-reads and dedupe absorbs it.
                self._failed("commit", exc)
                log.warning("cdc ingest: commit failed after a rebalance: %r", exc)
        self._count(records, plan)
        self._record(plan, committed_at)
        return len(records)

    async def _decide_letters(
        self, plan: BatchPlan, decided: set[str] | None = None, known: set[str] | None = None
    ) -> list[str]:
        """Leave out of ``plan`` the letters decided before (published, then a crash before the
        offset commit), record the others pending; returns their keys to confirm after the produce.
        Redis unreachable: the letters go out undecided (at-least-once, as before), with a warning.

        ``decided`` and ``known`` carry one step's state into the one-record fallback, which plans
        the batch again: origins found decided before (left out again, not asked again) and origins
        this step recorded pending already (not recorded twice); both are updated here.
        """
        decisions = self.decisions
        if decisions is None or not plan.dead_letters:
            return []
        decided = set() if decided is None else decided
        known = set() if known is None else known
        ask = [k for k in map(letter_key, plan.dead_letters) if k not in decided and k not in known]
        if ask:
            decided |= await self._decision_call(decisions.taken(ask)) or set()
        if decided:
            dlq = self.settings.dlq_topic
            plan.dead_letters = [dl for dl in plan.dead_letters if letter_key(dl) not in decided]
            plan.outgoing = [
                o
                for o in plan.outgoing
                if o.topic != dlq or letter_key(DeadLetter.from_record(o.key, o.value, o.headers or [])) not in decided
            ]
        new = [dl for dl in plan.dead_letters if letter_key(dl) not in known]
        known.update(map(letter_key, new))
        keys = await self._decision_call(decisions.publishing(new, int(time.time() * 1000)))
        return keys or []

    async def _decision_call(self, call: Any) -> Any:
        try:
            return await call
        except (RedisError, OSError) as exc:
            log.warning("cdc ingest: dead-letter decisions unavailable, letters may repeat: %r", exc)
            return None

    def _plan(
        self,
        records: list[Any],
        too_large: Mapping[tuple[str, int, int], str] | None = None,
        dlq_max_value_bytes: int | None = None,
    ) -> BatchPlan:
        dlq_max = self.settings.cdc_dlq_max_value_bytes if dlq_max_value_bytes is None else dlq_max_value_bytes
        now_ms = int(time.time() * 1000)
        return plan_batch(records, self.mapping, self.settings, now_ms, dlq_max, self.limits, too_large)

    @staticmethod
    async def _produce(
        producer: AIOKafkaProducer,
        outgoing: Sequence[Outgoing],
        sent: list[tuple[Outgoing, asyncio.Future[Any]]] | None = None,
    ) -> None:
        """Hand every record to the producer, then wait for all acknowledgements (``sent``: each
        record handed over and its delivery future, for a caller that needs to know which landed)."""
        futures = [await producer.send(o.topic, o.value, key=o.key, headers=o.headers) for o in outgoing]
        if sent is not None:
            sent.extend(zip(outgoing, futures, strict=True))
        await asyncio.gather(*futures)

    async def _letters_delivered(self, sent: Sequence[tuple[Outgoing, asyncio.Future[Any]]]) -> set[str]:
        """Decision keys of the dead letters among ``sent`` that the broker acknowledged (waits for
        every delivery to end first)."""
        await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
        dlq = self.settings.dlq_topic
        return {
            letter_key(DeadLetter.from_record(o.key, o.value, o.headers or []))
            for o, f in sent
            if o.topic == dlq and not f.cancelled() and f.exception() is None
        }

    async def _produce_one_by_one(
        self, records: list[Any], decided: set[str], known: set[str]
    ) -> tuple[BatchPlan, list[str]]:
        """Produce a batch record by record (in order) on a new producer; dead-letter what is refused.

        The old producer is dropped: after a refused batch its idempotence sequence can no longer be
        trusted. Records already produced by the failed attempt are produced again (same bytes,
        same event ids: the applier dedupes them). Each record's plan goes through the same
        dead-letter decisions as the batch's (``decided``, ``known``: see ``_decide_letters``): a
        letter decided before is not sent again, a new one (``event-too-large``) is recorded
        pending before it is sent; returns the merged plan and the keys to confirm.
        """
        old, self._producer = self._producer, self._new_producer()
        if old is not None:
            await old.stop()
        producer = self._producer
        await producer.start()
        await self.refresh_limits()
        merged = BatchPlan()
        keys: list[str] = []
        for rec in records:
            plan = self._plan([rec])
            keys += await self._decide_letters(plan, decided, known)
            key = (rec.topic, rec.partition, rec.offset)
            try:
                await self._produce(producer, plan.outgoing)
            except MessageSizeTooLargeError as exc:
                detail = f"the broker refused the change event produced from this record: {exc!r}"
                plan = self._plan([rec], {key: detail})
                keys += await self._decide_letters(plan, decided, known)
                try:
                    await self._produce(producer, plan.outgoing)
                except MessageSizeTooLargeError:
                    # Even the dead letter with the raw value is too large: send it without the value.
                    plan = self._plan([rec], {key: detail}, dlq_max_value_bytes=0)
                    await self._decide_letters(plan, decided, known)  # recorded pending just above
                    await self._produce(producer, plan.outgoing)
                log.warning("cdc ingest: %s/%s@%s dead-lettered as %s", rec.topic, rec.partition, rec.offset, TOO_LARGE)
            merged.outgoing.extend(plan.outgoing)
            merged.events += plan.events
            merged.ignored.update(plan.ignored)
            merged.rejected.update(plan.rejected)
            merged.dead_letters.extend(plan.dead_letters)
            for tp, off in plan.commit.items():
                merged.commit[tp] = max(merged.commit.get(tp, 0), off)
        return merged, keys

    def _failed(self, kind: str, exc: BaseException) -> None:
        if kind == "produce":
            self.stats.produce_failures += 1
        elif kind == "commit":
            self.stats.commit_failures += 1
        elif kind == "broker-refused":
            self.stats.refused_batches += 1
        self.last_failure = f"{kind}: {exc!r}"[:300]
        if self.metrics is not None:
            self.metrics.cdc_batch(skipped={}, events=0, failures={kind: 1}, committed_at=None)

    def _count(self, records: list[Any], plan: BatchPlan) -> None:
        s = self.stats
        s.consumed += len(records)
        s.events += plan.events
        s.batches += 1
        s.too_large += plan.rejected.get(TOO_LARGE, 0)
        s.ignored.update(plan.ignored)
        s.rejected.update(+plan.rejected)
        s.world_unchecked.update(plan.world_unchecked)
        for label in plan.world_unchecked.keys() - self._warned_unchecked:
            self._warned_unchecked.add(label)
            log.warning("cdc ingest: %s", unchecked_world_warning(label, self.mapping))
        if self.metrics is not None:
            for topic, n in Counter(r.topic for r in records).items():
                self.metrics.consumed(topic, n)

    def _record(self, plan: BatchPlan | None, committed_at: float | None = None) -> None:
        """Metrics of one batch (or of a failed attempt) and the rate-limited counters log line."""
        if self.metrics is not None and plan is not None:
            too_large = plan.rejected.get(TOO_LARGE, 0)
            self.metrics.cdc_batch(
                skipped=plan.ignored,
                events=plan.events,
                failures={TOO_LARGE: too_large} if too_large else {},
                committed_at=committed_at,
            )
            for dl in plan.dead_letters:
                self.metrics.dead_lettered(dl.topic, dl.reason, world=dl.world_id)
        self._export_waiting()
        self._maybe_log()

    def _export_waiting(self) -> None:
        if self.metrics is not None:
            self.metrics.cdc_waiting_records(self.records_waiting())

    def _maybe_log(self, now: float | None = None) -> bool:
        """Log what changed in the counters since the last line, at most every ``log_interval_s``."""
        now = time.monotonic() if now is None else now
        interval = self.settings.cdc_log_interval_s
        if interval <= 0 or now - self._logged_at < interval:
            return False
        line = counters_line(self._logged, self.stats, now - self._logged_at)
        self._logged_at = now
        if line is None:
            return False
        self._logged = dataclasses.replace(
            self.stats, ignored=Counter(self.stats.ignored), rejected=Counter(self.stats.rejected)
        )
        log.info("cdc ingest: %s", line)
        return True


async def run_forever(
    settings: Settings | None = None,
    mapping: CdcMapping | None = None,
) -> None:
    """Standalone entry point: settings and mapping from the environment."""
    settings = settings or Settings.from_env()
    mapping = mapping or load_cdc_mapping(settings)  # validated before anything connects
    ingest = CdcIngest(settings, mapping, decisions=decisions_from_settings(settings))
    await ingest.start()
    try:
        await ingest.run()
    finally:
        await ingest.stop()


class CdcIngestService:
    """Marker base: the mode Service ``attach`` adds to a Faust app carries its ingest as ``.ingest``."""

    ingest: CdcIngest


def attach(app: Any, settings: Settings, mapping: CdcMapping, **kwargs: Any) -> CdcIngest:
    """Run the ingest inside a Faust worker: started after the app starts, stopped with it."""
    from mode import Service

    kwargs.setdefault("decisions", decisions_from_settings(settings))
    ingest = CdcIngest(settings, mapping, **kwargs)

    class _Service(Service, CdcIngestService):
        async def on_start(self) -> None:
            await ingest.start()
            self.add_future(ingest.run())

        async def on_stop(self) -> None:
            await ingest.stop()

    service = _Service()
    service.ingest = ingest
    app.add_dependency(service)
    return ingest


def attached_ingest(app: Any) -> CdcIngest | None:
    """The ingest ``attach`` added to a Faust app (for /health and /summary), or None."""
    for child in getattr(app, "_children", ()):
        if isinstance(child, CdcIngestService):
            return child.ingest
    return None


def main() -> int:
    """``python -m agents.cdc``: the ingest alone, configured from ``CAUSEWAY_*`` variables.

    A bad setting or mapping prints its problems (one per line) and exits 2, before anything connects.
    """
    try:
        settings = Settings.from_env()
        mapping = load_cdc_mapping(settings)
    except (MappingError, SettingsError) as exc:
        print(f"causeway cdc: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run_forever(settings, mapping))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
