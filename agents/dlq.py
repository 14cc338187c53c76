"""Reading the dead-letter topic and redriving letters (the I/O half of ``agents.redrive``).

The redrive ledger (``causeway:redriven:<dlq topic>:<partition>:<offset>`` in Redis, TTL
``dedupe_ttl_s``) is written *after* the broker confirmed the re-published record: a crash in
between re-sends it on the next run, which dedupe by event id makes harmless, whereas the other
order could lose a redrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from agents.deadletters import topic_partitions
from agents.marks import AppliedMarks
from agents.redrive import (
    Decision,
    DlqFilter,
    DlqRecord,
    causes_wanted,
    collapse,
    decide,
    redrive_headers,
    topic_kind,
)
from models.deadletter import DeadLetter
from models.events import ChangeEvent, decode
from models.worlds import InvalidWorldId, WorldNaming
from sinks.nessie import NessieClient
from streams.security import kafka_client_options, redis_options
from streams.settings import Settings
from worlds.manager import WorldManager

LEDGER_PREFIX = "causeway:redriven:"


def ledger_key(dlq_topic: str, ref: str) -> str:
    return f"{LEDGER_PREFIX}{dlq_topic}:{ref}"


async def read_dlq(
    settings: Settings, flt: DlqFilter, progress: Callable[[int], None] | None = None
) -> tuple[list[DlqRecord], int]:
    """Every letter of the DLQ topic matching ``flt``, oldest first, one per origin (copies that
    redelivery made are attached to the first, see ``agents.redrive.collapse``); and how many DLQ
    records were scanned."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, **kafka_client_options(settings)
    )
    try:
        await consumer.start()  # inside: a failed start still closes the client (no "Unclosed" noise)
        tps = await topic_partitions(consumer, settings.dlq_topic)
        if not tps:
            return [], 0
        ends = await consumer.end_offsets(tps)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        everything: list[DlqRecord] = []
        scanned = 0
        open_tps = {tp for tp in tps if ends[tp] > 0}
        for tp in set(tps) - open_tps:
            consumer.pause(tp)
        idle = 0
        while open_tps and idle < 10:
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            idle = 0 if batch else idle + 1
            for tp, recs in batch.items():
                for r in recs:
                    if r.offset >= ends[tp]:
                        break
                    scanned += 1
                    everything.append(
                        DlqRecord(
                            tp.partition, r.offset, r.timestamp, DeadLetter.from_record(r.key, r.value, list(r.headers))
                        )
                    )
                if progress is not None:
                    progress(len(recs))
            for tp in list(open_tps):
                if await consumer.position(tp) >= ends[tp]:
                    open_tps.discard(tp)
                    consumer.pause(tp)
        # By DLQ position across partitions; then one record per origin, then the filter.
        everything.sort(key=lambda rec: (rec.timestamp_ms, rec.partition, rec.offset))
        return [rec for rec in collapse(everything) if flt.matches(rec)], scanned
    finally:
        await consumer.stop()


@dataclass
class RedriveResult:
    decisions: list[Decision] = field(default_factory=list)
    sent: int = 0

    def count(self, action: str) -> int:
        return sum(1 for d in self.decisions if d.action == action)


async def plan_redrive(settings: Settings, records: Sequence[DlqRecord], *, force: bool, again: bool) -> list[Decision]:
    """One decision per letter, after asking Redis (marks, ledger) and Nessie (worlds, causes)."""
    kinds = {r.ref: topic_kind(r.letter.topic, settings.objects_topic, settings.links_topic) for r in records}
    events: dict[str, ChangeEvent] = {}
    for r in records:
        ev = decode(r.letter.value, r.letter.key, kinds[r.ref], settings.max_event_bytes)
        if isinstance(ev, ChangeEvent):
            events[r.ref] = ev
    refs = [(ev.world_id, ev.event_id) for ev in events.values()]
    wanted = causes_wanted(records, events)
    marks = AppliedMarks.from_url(settings.redis_url, settings.dedupe_ttl_s, **redis_options(settings))
    client = aioredis.Redis.from_url(settings.redis_url, **redis_options(settings))
    try:
        applied = await marks.applied(refs)
        causes_marked = await marks.applied(wanted) if wanted else set()
        refs_all = [ref for r in records for ref in r.refs]
        hits = await client.mget([ledger_key(settings.dlq_topic, ref) for ref in refs_all]) if refs_all else []
        redriven = {ref for ref, hit in zip(refs_all, hits, strict=True) if hit}
    finally:
        await marks.close()
        await client.aclose()
    present: set[str] = set()
    naming = WorldNaming(settings.prod_world, settings.main_branch)
    async with NessieClient.from_settings(settings) as nessie:
        manager = WorldManager(nessie, naming)
        for w in {ev.world_id for ev in events.values()}:
            try:
                if await manager.get(w) is not None:
                    present.add(w)
            except InvalidWorldId:
                pass
    # A cause is present when marked, in its branch's event log (marks expire; the log is the
    # truth), or redriven in the same run (it arrives with its effect).
    sent_with = set(refs) & wanted
    unresolved = wanted - causes_marked - sent_with
    in_log = await asyncio.to_thread(_causes_in_logs, settings, naming, unresolved, present)
    causes_present = causes_marked | sent_with | in_log
    return [
        decide(
            r,
            kind=kinds[r.ref],
            max_bytes=settings.max_event_bytes,
            applied=applied,
            worlds_present=present,
            redriven=redriven,
            causes_present=causes_present,
            force=force,
            again=again,
        )
        for r in records
    ]


def _causes_in_logs(
    settings: Settings, naming: WorldNaming, causes: set[tuple[str, str]], worlds: set[str]
) -> set[tuple[str, str]]:
    """The (world, event id) pairs of ``causes`` that their world branch's event log holds."""
    if not causes:
        return set()
    from agents.replayer import ReplayCommitter
    from sinks.committer import BatchCommitter

    log = ReplayCommitter(BatchCommitter(settings))
    found: set[tuple[str, str]] = set()
    for world in {w for w, _ in causes} & worlds:
        ids = [i for w, i in causes if w == world]
        found |= {(world, i) for i in log.event_ids_in_log(naming.branch(world), ids)}
    return found


async def send(settings: Settings, decisions: Sequence[Decision], progress: Callable[[int], None] | None = None) -> int:
    """Publish the letters decided ``redrive`` to their original topics; returns how many were sent."""
    todo = [d for d in decisions if d.send]
    if not todo:
        return 0
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        **kafka_client_options(settings),
    )
    client = aioredis.Redis.from_url(settings.redis_url, **redis_options(settings))
    await producer.start()
    sent = 0
    try:
        for i in range(0, len(todo), 500):
            chunk = todo[i : i + 500]
            futures = [
                await producer.send(
                    d.record.letter.topic,
                    value=d.record.letter.value,
                    key=d.record.letter.key,
                    headers=redrive_headers(d.record, settings.dlq_topic),
                )
                for d in chunk
            ]
            for fut in futures:
                await fut
            async with client.pipeline(transaction=False) as pipe:
                for d in chunk:
                    for ref in d.record.refs:  # every copy of the letter: it was sent once for all
                        pipe.set(ledger_key(settings.dlq_topic, ref), b"1", ex=settings.dedupe_ttl_s)
                await pipe.execute()
            sent += len(chunk)
            if progress is not None:
                progress(len(chunk))
    finally:
        await producer.stop()
        await client.aclose()
    return sent
