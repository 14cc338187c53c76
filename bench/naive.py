"""The naive design of the seed sketches, implemented honestly as a benchmark contender.

    python -m bench.naive CONFIG.json      (started by the harness; SIGTERM stops it)

What the sketches describe, and what this does, per consumed record in offset order:

* ``IdempotentConsumer.consume``: ``EXISTS processed:<event_id>`` in Redis (one round trip per event);
  a hit is skipped as a duplicate;
* causal deferral: an event whose ``caused_by`` is not ``EXISTS`` yet is deferred and retried every
  ``causal_retry_s`` (100 ms in the sketch) with another EXISTS, and dropped after
  ``causal_timeout_s``; later events of the same key are *not* held back (the sketch's flaw);
* ``_process`` = the ``commit_changes`` / ``NessieOCCWriter`` path: buffered events of a world are
  committed every ``batch_size`` events (1 = a commit per event): read the branch HEAD, append the
  events to ``entity_events`` and ``upsert`` the objects and links into ``entity_common`` /
  ``entity_edge`` with pyiceberg (copy-on-write, as the sketch's ``IcebergOverwrite``), then one Nessie
  commit of all three tables with the HEAD as the expected hash; a conflict backs off 0.1 s × 2^n,
  three attempts;
* then ``SET processed:<event_id> 1 EX 7d`` per event (after the write, non-atomically, as sketched),
  then the Kafka offsets (never past a deferred event, so the harness's "drained" is honest).

It uses causeway's own primitives (event validation, Arrow rows, the Nessie catalog's one-commit
publish), so the difference from causeway is the design, not the plumbing. The sketch's version check
is not done (pyiceberg's upsert has none); invalid records are counted and skipped (the sketch has no
dead-letter topic).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

import redis.asyncio as aioredis

from bench.contender import (
    Contender,
    ContenderConfig,
    commit_properties,
    expire_old_snapshots,
    load_or_create,
)
from models.events import ChangeEvent, EntityKind, Invalid, decode
from sinks.errors import NessieConflict
from sinks.rows import Source, events_arrow, projection_arrow
from sinks.tables import COMMON, EDGE, EVENTS
from streams.security import redis_options

TTL_S = 7 * 24 * 3600


@dataclass
class Deferred:
    event: ChangeEvent
    source: Source
    first_seen: float
    retry_at: float


class Naive(Contender):
    def __init__(self, cfg: ContenderConfig) -> None:
        super().__init__(cfg)
        self.redis = aioredis.Redis.from_url(self.settings.redis_url, **redis_options(self.settings))
        self.pending: dict[str, list[tuple[ChangeEvent, Source]]] = defaultdict(list)
        self.pending_since: dict[str, float] = {}
        self.deferred: list[Deferred] = []
        self.outstanding: dict[tuple[str, int], set[int]] = defaultdict(set)
        self.next_offset: dict[tuple[str, int], int] = {}
        self.seq = 0

    def _key(self, event_id: str) -> str:
        return f"{self.cfg.redis_prefix}{event_id}"

    async def _exists(self, event_id: str) -> bool:
        self.stats.redis_calls += 1
        return bool(await self.redis.exists(self._key(event_id)))

    async def consume_one(self, event: ChangeEvent, src: Source, now: float) -> None:
        if await self._exists(event.event_id):
            self.stats.duplicates += 1
            self._settle(src)
            return
        if event.caused_by and not await self._exists(event.caused_by):
            self.stats.deferred += 1
            self.deferred.append(Deferred(event, src, now, now + self.cfg.causal_retry_s))
            return
        await self._buffer(event, src)

    async def _buffer(self, event: ChangeEvent, src: Source) -> None:
        world = event.world_id
        self.pending[world].append((event, src))
        self.pending_since.setdefault(world, time.monotonic())
        if len(self.pending[world]) >= self.cfg.batch_size:
            await self.flush(world)

    async def retry_deferred(self, now: float) -> None:
        due = [d for d in self.deferred if d.retry_at <= now]
        if not due:
            return
        self.deferred = [d for d in self.deferred if d.retry_at > now]
        for d in due:
            if d.event.caused_by and not await self._exists(d.event.caused_by):
                if now - d.first_seen > self.cfg.causal_timeout_s:
                    self.stats.expired += 1
                    self._settle(d.source)
                else:
                    d.retry_at = now + self.cfg.causal_retry_s
                    self.deferred.append(d)
                continue
            await self._buffer(d.event, d.source)

    def _settle(self, src: Source) -> None:
        self.outstanding[src.tp].discard(src.offset)

    async def flush(self, world: str) -> None:
        items = self.pending.pop(world, [])
        self.pending_since.pop(world, None)
        if not items:
            return
        self.seq += 1
        batch_id = f"naive-{uuid.uuid4().hex[:8]}-{self.seq}"
        started = time.monotonic()
        await asyncio.to_thread(self._commit, world, batch_id, items)
        self.stats.commit_seconds.append(time.monotonic() - started)
        self.stats.commits += 1
        self.stats.events_committed += len(items)
        for ev, src in items:
            self.stats.redis_calls += 1
            await self.redis.set(self._key(ev.event_id), "1", ex=TTL_S)
            self._settle(src)
        await self.commit_offsets(self._committable())
        self.dump_stats()

    def _commit(self, world: str, batch_id: str, items: list[tuple[ChangeEvent, Source]]) -> None:
        offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
        for _, src in items:
            offsets[src.tp].append(src.offset)
        props = commit_properties(world, batch_id, offsets)
        ns = self.cfg.namespace
        for attempt in range(self.cfg.max_retries):
            cat = self.catalog(world)
            cat.begin()  # GET the branch HEAD: the expected hash of the commit
            try:
                now = datetime.now(UTC)
                buckets, size = self.settings.projection_buckets, self.cfg.target_file_bytes
                tables = {
                    d.name: load_or_create(cat, ns, d, projection_buckets=buckets, target_file_bytes=size)
                    for d in (EVENTS, COMMON, EDGE)
                }
                tx = tables[EVENTS.name].transaction()
                tx.append(events_arrow(items, batch_id, now, set()))
                expire_old_snapshots(tx, self.cfg.expire_every)
                tx.commit_transaction()
                for kind, tdef in ((EntityKind.OBJECT, COMMON), (EntityKind.LINK, EDGE)):
                    latest: dict[tuple[str, str], ChangeEvent] = {}
                    for ev, _ in items:
                        if ev.kind is kind:
                            latest[(ev.entity_type, ev.entity_pk)] = ev  # upsert rejects repeated keys
                    if latest:
                        rows = projection_arrow(tdef, list(latest.values()), batch_id, now)
                        tables[tdef.name].upsert(rows, join_cols=list(tdef.key))
                cat.publish(f"naive: world {world} batch {batch_id}", props)
                return
            except NessieConflict:
                self.stats.conflicts += 1
                if attempt + 1 >= self.cfg.max_retries:
                    raise
                time.sleep(0.1 * 2**attempt)
            finally:
                cat.discard()

    def _committable(self) -> dict[tuple[str, int], int]:
        out = {}
        for tp, nxt in self.next_offset.items():
            waiting = self.outstanding.get(tp)
            out[tp] = min(waiting) if waiting else nxt
        return out

    async def loop(self) -> None:
        kinds = {self.cfg.topics[0]: EntityKind.OBJECT, self.cfg.topics[1]: EntityKind.LINK}
        while not self.stopping.is_set():
            batch = await self.consumer.getmany(timeout_ms=self.cfg.poll_ms, max_records=500)
            now = time.monotonic()
            for tp, records in batch.items():
                for rec in records:
                    if self.stopping.is_set():
                        break
                    key = (tp.topic, tp.partition)
                    src = Source(tp.topic, tp.partition, rec.offset)
                    self.outstanding[key].add(rec.offset)
                    self.next_offset[key] = rec.offset + 1
                    result = decode(rec.value, rec.key, kinds.get(tp.topic))
                    if isinstance(result, Invalid) or result.world_id not in self.cfg.branches:
                        self.stats.bad += 1
                        self._settle(src)
                        continue
                    await self.consume_one(result, src, now)
            await self.retry_deferred(time.monotonic())
            idle = not batch
            for world, since in list(self.pending_since.items()):
                if idle or time.monotonic() - since > 1.0:
                    await self.flush(world)
            if idle:
                await self.commit_offsets(self._committable())
            self.dump_stats()
        await self.redis.aclose()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cfg = ContenderConfig.load(args[0])

    async def run() -> None:
        await Naive(cfg).main()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
