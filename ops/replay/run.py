"""Running a replay: a plain consumer assigned to the range feeds the normal applier in-process.

The records go through :class:`agents.applier.Applier` with the real Redis marks, batch committer,
dead-letter publisher and world checks, exactly as a worker would process them, so dedupe makes a
replay harmless. The consumer has no group: the worker group's offsets are never touched.

One wrapper sits between the applier and the committer, :class:`ReplayCommitter`:

* it drops ``Batch.settled`` (the floors a worker passes to keep the branch's offset summary
  short): a replay reads a slice, possibly filtered, so "everything below my position is settled"
  is not true for it, and a floor could hide events the live worker has not applied yet;
* it asks the branch's event log which of the batch's event ids it already holds and leaves those
  out. Redis marks expire (``dedupe_window_s``) and an offset reset can move a branch's recorded floor
  past events that never took effect; the log is the truth. An event whose offset is recorded as
  settled but whose id is *not* in the log (skipped by an offset reset) is applied, with its source
  offset kept out of the committer's offset check.

Checkpoints live in Redis (``causeway:replay:<id>``, TTL ``dedupe_ttl_s``): the operator may resume
from another host or pod, Redis already holds the cross-worker state, and a checkpoint is worth
exactly as long as the dedupe marks that make re-reading harmless. Losing one only means reading
again from the start, which dedupe absorbs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.applier import Applier, RawRecord
from agents.deadletter_publisher import DeadLetterPublisher
from agents.marks import AppliedMarks, DeadLetterMarks
from models.events import EntityKind, Invalid, decode
from models.worlds import WorldNaming
from monitoring.discovery import pid_alive
from monitoring.metrics import Dependency, Metrics
from ops.replay.plan import Checkpoint, ReplayError, ReplaySpec, next_offset, resolve_range, rewrite
from sinks.committer import Batch, BatchCommitter, CommitOutcome
from sinks.nessie import NessieClient
from sinks.readback import open_table, recent_event_ids, rows_matching, scan_rows
from sinks.tables import ENTITY_EVENTS
from streams.kafka import topic_partitions
from streams.security import kafka_client_options, redis_options
from streams.settings import Settings
from worlds.manager import ForkSource, WorldManager

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "causeway:replay:"
LOCK_SUFFIX = ":lock"
LOCK_TTL_S = 60


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")

    return True


class CheckpointStore:
    """Replay checkpoints in Redis, one JSON document per replay id."""

    def __init__(self, client: aioredis.Redis, ttl_s: int) -> None:
        self.redis = client
        self.ttl = ttl_s
        self.me = f"{socket.gethostname()}:{os.getpid()}"

    @classmethod
    def from_settings(cls, settings: Settings) -> CheckpointStore:
        return cls(aioredis.Redis.from_url(settings.redis_url, **redis_options(settings)), settings.dedupe_ttl_s)

    async def load(self, replay_id: str) -> Checkpoint | None:
        raw = await self.redis.get(CHECKPOINT_PREFIX + replay_id)
        return Checkpoint.from_json(raw) if raw else None

    async def save(self, cp: Checkpoint) -> None:
        cp.updated_ms = int(time.time() * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(CHECKPOINT_PREFIX + cp.replay_id, cp.to_json(), ex=self.ttl)
            pipe.expire(CHECKPOINT_PREFIX + cp.replay_id + LOCK_SUFFIX, LOCK_TTL_S)
            await pipe.execute()

    async def acquire(self, replay_id: str) -> None:
        """Hold the replay's lock (one process per replay id); raises ReplayError if it is held.

        The lock expires ``LOCK_TTL_S`` after the last checkpoint save, so a killed run frees it;
        on the same host a holder whose process is gone is replaced at once.
        """
        key = CHECKPOINT_PREFIX + replay_id + LOCK_SUFFIX
        if await self.redis.set(key, self.me, nx=True, ex=LOCK_TTL_S):
            return
        holder = _text(await self.redis.get(key))
        host, _, pid = holder.rpartition(":")
        if host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
            await self.redis.set(key, self.me, ex=LOCK_TTL_S)
            return
        ttl = await self.redis.ttl(key)
        raise ReplayError(
            f"replay {replay_id} is already running ({holder}); if that process is gone its lock expires in {ttl}s"
        )

    async def release(self, replay_id: str) -> None:
        key = CHECKPOINT_PREFIX + replay_id + LOCK_SUFFIX
        if _text(await self.redis.get(key)) == self.me:
            await self.redis.delete(key)

    async def delete(self, replay_id: str) -> None:
        await self.redis.delete(CHECKPOINT_PREFIX + replay_id)

    async def close(self) -> None:
        await self.redis.aclose()


@dataclass
class CommitCounts:
    applied: int = 0
    stale: int = 0
    in_log: int = 0  # left out: the branch's log already holds the event id
    by_offset: int = 0  # left out by the committer: offset already recorded on the branch
    unrecorded: int = 0  # offset recorded as settled but the event was missing from the log


class ReplayCommitter:
    """The batch committer as a replay needs it (see the module docstring)."""

    def __init__(self, inner: BatchCommitter) -> None:
        self.inner = inner
        self.counts = CommitCounts()

    async def commit_batch_async(self, batch: Batch) -> CommitOutcome:
        return await asyncio.to_thread(self.commit_batch, batch)

    def commit_batch(self, batch: Batch) -> CommitOutcome:
        branch = self.inner.naming.branch(batch.world_id)
        # Both reads at one pinned hash: a live commit between them would make an event look
        # recorded but absent from the log, and it would be committed a second time.
        pinned = f"{branch}@{self.inner.client.get_reference(branch).hash}"
        present = self.event_ids_in_log(pinned, [e.event_id for e in batch.events])
        recorded = self.inner.committed_offsets(pinned)
        sources = list(batch.sources) if batch.sources is not None else [None] * len(batch.events)
        events, kept_sources = [], []
        for ev, src in zip(batch.events, sources, strict=True):
            if ev.event_id in present:
                self.counts.in_log += 1
                continue
            if src is not None and src.tp in recorded and src.offset in recorded[src.tp]:
                self.counts.unrecorded += 1
                src = None  # recorded as settled, yet not in the log: it never took effect
            events.append(ev)
            kept_sources.append(src)
        outcome = self.inner.commit_batch(
            Batch(batch.world_id, batch.batch_id, events, batch.offsets, kept_sources, settled={})
        )
        self.counts.applied += outcome.events_appended - outcome.events_stale
        self.counts.stale += outcome.events_stale
        self.counts.by_offset += outcome.events_replayed
        return outcome

    def event_ids_in_log(self, branch: str, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        table = open_table(self.inner.catalog(branch), self.inner.settings.namespace, ENTITY_EVENTS)
        return {r["event_id"] for r in rows_matching(table, "event_id", ids, ("event_id",))}


class _Worlds:
    def __init__(self, manager: WorldManager) -> None:
        self.manager = manager

    async def exists(self, world_id: str) -> bool:
        return await self.manager.get(world_id) is not None

    async def ensure(self, world_id: str) -> None:
        await self.manager.create(world_id)


@dataclass
class ReplayReport:
    replay_id: str
    checkpoint: Checkpoint
    resumed: bool
    already_complete: bool
    read_this_run: int = 0
    seconds: float = 0.0
    world_created: bool = False
    interrupted: bool = False
    causes_missing: int = 0  # parked events dead-lettered at the end: their cause is nowhere
    notes: list[str] = field(default_factory=list)


Progress = Callable[[int], None]


async def plan(settings: Settings, spec: ReplaySpec) -> dict[tuple[str, int], tuple[int, int]]:
    """Resolve the spec to concrete ``[start, end)`` per partition (reads the brokers only)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, **kafka_client_options(settings)
    )
    await consumer.start()
    try:
        tps: list[TopicPartition] = []
        for topic in spec.topics:
            available = await topic_partitions(consumer, topic)
            if not available:
                raise ReplayError(f"topic {topic} does not exist")
            tps += [TopicPartition(topic, p) for p in spec.partitions(topic, available)]
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        at_from = await consumer.offsets_for_times(dict.fromkeys(tps, spec.from_ms)) if spec.from_ms else {}
        at_to = await consumer.offsets_for_times(dict.fromkeys(tps, spec.to_ms)) if spec.to_ms else {}
        out = {}
        for tp in tps:
            f, t = at_from.get(tp), at_to.get(tp)
            out[(tp.topic, tp.partition)] = resolve_range(
                spec,
                (tp.topic, tp.partition),
                begins[tp],
                ends[tp],
                f.offset if f is not None else None,
                t.offset if t is not None else None,
            )
        return out
    finally:
        await consumer.stop()


async def prepare_world(
    settings: Settings, spec: ReplaySpec, source_world: str, allow_existing: bool = False, allow_prod: bool = False
) -> tuple[str, bool]:
    """Create the into-world branch at ``spec.fork_from`` and mark the events it already holds.

    The marks say "applied in the new world" for every event id of the forked log, which is true:
    the fork holds them. Without them an event whose cause predates the fork would wait for a
    cause the new world's marks never show. Returns (fork hash, created).

    A world that already exists is refused unless ``allow_existing`` (``--into-existing``): a replay
    must not write into somebody's world by a typo, and the fork point says nothing about what the
    world holds. The production world also needs ``allow_prod`` (``--confirm-prod``).
    """
    assert spec.into_world is not None
    naming = WorldNaming(settings.prod_world, settings.main_branch)
    async with NessieClient.from_settings(settings) as nessie:
        manager = WorldManager(nessie, naming)
        await check_target(manager, settings, spec, allow_existing=allow_existing, allow_prod=allow_prod)
        source = ForkSource(commit=spec.fork_from) if spec.fork_from else ForkSource(world=source_world)
        world, created = await manager.create(spec.into_world, source)
    ids = await asyncio.to_thread(_log_event_ids, settings, f"{world.branch}@{world.hash}")
    marks = AppliedMarks.from_settings(settings, **redis_options(settings))
    try:
        for i in range(0, len(ids), 5000):
            await marks.mark([(spec.into_world, e) for e in ids[i : i + 5000]])
    finally:
        await marks.close()
    return world.hash, created


async def check_target(
    manager: WorldManager, settings: Settings, spec: ReplaySpec, *, allow_existing: bool, allow_prod: bool
) -> None:
    """The checks of ``--into-world`` (the dry run makes them too); raises ReplayError."""
    assert spec.into_world is not None
    if spec.into_world == settings.prod_world and not allow_prod:
        raise ReplayError(
            f"--into-world {spec.into_world} is the production world: add --into-existing --confirm-prod "
            "if you really mean to replay into it"
        )
    existing = await manager.get(spec.into_world)
    if existing is not None and not allow_existing:
        raise ReplayError(
            f"world {spec.into_world} already exists (at {existing.hash[:12]}); --into-world creates a new "
            "world: choose a new world id, delete it first, or replay into it anyway with --into-existing"
        )


def expand_commit(settings: Settings, world: str, prefix: str, max_commits: int = 20_000) -> str:
    """The full hash of a commit of ``world``'s branch given a prefix (Nessie needs full hashes)."""
    if len(prefix) == 64:
        return prefix
    from sinks.nessie import SyncNessieClient

    branch = WorldNaming(settings.prod_world, settings.main_branch).branch(world)
    seen = 0
    with SyncNessieClient.from_settings(settings) as client:
        empty = client.config().no_ancestor_hash  # the empty repository's beginning: not in any history
        if empty.startswith(prefix.lower()):
            return empty
        for page in client.history(branch, max_records=500):
            for entry in page:
                if entry.hash.startswith(prefix.lower()):
                    return entry.hash
                seen += 1
            if seen >= max_commits:
                break
    raise ReplayError(f"no commit {prefix} in the newest {seen} commits of {branch}; give the full hash")


def _log_event_ids(settings: Settings, ref: str) -> list[str]:
    from sinks.catalog import NessieCatalog

    cat = NessieCatalog.from_settings(settings, ref)
    return [r["event_id"] for r in scan_rows(open_table(cat, settings.namespace, ENTITY_EVENTS), ("event_id",))]


async def run_replay(
    settings: Settings,
    spec: ReplaySpec,
    *,
    store: CheckpointStore,
    progress: Progress | None = None,
    restart: bool = False,
    stop_after: int | None = None,
    wait_parked_s: float = 5.0,
    on_start: Callable[[Checkpoint], None] | None = None,
    into_existing: bool = False,
    allow_prod: bool = False,
    outage_s: float = 30.0,
) -> ReplayReport:
    """Replay ``spec`` from its checkpoint (or from the start); returns what happened.

    ``stop_after`` stops after that many records have been read (an interruption, for tests and
    for bounded runs); the checkpoint then says where to resume. When the whole range was read,
    events still waiting for a cause that is neither in the range nor on the branch are
    dead-lettered (``cause-missing``, as a worker would after its causal timeout) so the replay
    completes. Raises ReplayError while another process runs the same replay, and DependencyDown
    when Kafka, Redis or Nessie stays down for ``outage_s`` during the run (the checkpoint holds).
    """
    rid = spec.replay_id()
    await store.acquire(rid)
    watch = OutageWatch()
    stop = asyncio.Event()
    try:
        run = asyncio.ensure_future(
            _run(
                settings,
                spec,
                store,
                progress,
                restart,
                stop_after,
                wait_parked_s,
                on_start,
                into_existing,
                allow_prod,
                metrics=watch,
                stop=stop,
            )
        )
        while not run.done():
            try:
                await asyncio.wait({run}, timeout=1.0)
            except asyncio.CancelledError:
                # Ctrl-C: the run saves its checkpoint while it unwinds; wait for that. A library can
                # lose the cancellation (Python 3.11's wait_for does when its inner call finishes as
                # it lands: redis-py's writes): ``stop`` then ends the run at its next poll.
                stop.set()
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
                raise
            down = watch.down_for(time.monotonic())
            if down is not None and down[1] > outage_s and not run.done():
                # The applier retries a dependency forever (right for a worker); an operator's
                # command gives up instead: the checkpoint is saved while the run unwinds.
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
                raise DependencyDown(down[0], down[1])
        return run.result()
    finally:
        await store.release(rid)


async def _run(
    settings: Settings,
    spec: ReplaySpec,
    store: CheckpointStore,
    progress: Progress | None,
    restart: bool,
    stop_after: int | None,
    wait_parked_s: float,
    on_start: Callable[[Checkpoint], None] | None,
    into_existing: bool = False,
    allow_prod: bool = False,
    metrics: Metrics | None = None,
    stop: asyncio.Event | None = None,
) -> ReplayReport:
    started = time.monotonic()
    rid = spec.replay_id()
    cp = None if restart else await store.load(rid)
    resumed = cp is not None
    world_created = False
    if cp is None:
        ranges = await plan(settings, spec)
        cp = Checkpoint.start(rid, spec, ranges, int(time.time() * 1000))
        if spec.into_world:
            source_world = spec.worlds[0] if spec.worlds else settings.prod_world
            cp.fork_hash, world_created = await prepare_world(
                settings, spec, source_world, allow_existing=into_existing, allow_prod=allow_prod
            )
        await store.save(cp)
    report = ReplayReport(rid, cp, resumed, cp.complete, world_created=world_created)
    if on_start is not None:
        on_start(cp)
    if cp.complete:
        return report
    cp.runs += 1

    naming = WorldNaming(settings.prod_world, settings.main_branch)
    marks = AppliedMarks.from_settings(settings, **redis_options(settings))
    committer = ReplayCommitter(BatchCommitter(settings))
    clock = SkippableClock()
    dlq = DeadLetterPublisher(settings.kafka_bootstrap, settings.dlq_topic, kafka_client_options(settings))
    # The workers' dead-letter decisions: a record they dead-lettered is settled, not decided again.
    dead_marks = DeadLetterMarks.from_url(settings.redis_url, settings.dedupe_ttl_s, **redis_options(settings))
    nessie = NessieClient.from_settings(settings)
    applier = Applier(
        settings,
        marks=marks,
        committer=committer,
        dead_letters=dlq,
        worlds=_Worlds(WorldManager(nessie, naming)),
        metrics=metrics or Metrics(),
        worker_id=f"replay-{rid}",
        clock=clock,
        recent_event_ids=lambda world: asyncio.to_thread(recent_event_ids, settings, naming.branch(world)),
        dead_marks=dead_marks,
    )
    kinds = {settings.objects_topic: EntityKind.OBJECT, settings.links_topic: EntityKind.LINK}
    remaining = cp.remaining()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        enable_auto_commit=False,
        max_poll_records=2000,
        **kafka_client_options(settings),
    )
    await consumer.start()
    counts = dict.fromkeys(("read", "filtered_out", "invalid_skipped"), 0)
    read_pos: dict[tuple[str, int], int] = {tp: start for tp, (start, _) in remaining.items()}
    try:
        assigned = [TopicPartition(t, p) for (t, p) in remaining]
        consumer.assign(assigned)
        for (t, p), (start, _) in remaining.items():
            consumer.seek(TopicPartition(t, p), start)
        active = set(remaining)
        while active:
            if stop is not None and stop.is_set():
                raise asyncio.CancelledError  # the interrupt whose cancellation was lost
            budget = settings.batch_max_events
            if stop_after is not None:  # never read past the bound, however small
                budget = max(1, min(budget, stop_after - counts["read"]))
            before = counts["read"]
            batches = await consumer.getmany(timeout_ms=500, max_records=budget)
            records: list[RawRecord] = []
            for ktp, recs in batches.items():
                tp = (ktp.topic, ktp.partition)
                end = remaining[tp][1]
                for r in recs:
                    if r.offset >= end:
                        break
                    read_pos[tp] = r.offset + 1
                    counts["read"] += 1
                    raw = _select(spec, kinds.get(ktp.topic), r, settings.max_event_bytes, counts)
                    if raw is not None:
                        records.append(RawRecord(ktp.topic, ktp.partition, r.offset, raw[0], raw[1], raw[2], None))
            for tp in list(active):
                # The position passes gaps (compaction, transaction markers) that yield no record.
                ktp = TopicPartition(*tp)
                read_pos[tp] = max(read_pos[tp], min(await consumer.position(ktp), remaining[tp][1]))
                if read_pos[tp] >= remaining[tp][1]:
                    active.discard(tp)
                    consumer.pause(ktp)
            if records:
                await applier.process(records)
            await applier.tick()
            _advance(cp, applier, read_pos)
            if progress is not None and counts["read"] > before:
                progress(counts["read"] - before)  # records of the range only
            await store.save(cp)
            if stop_after is not None and counts["read"] >= stop_after:
                report.interrupted = True
                break
        await applier.flush_all()
        deadline = time.monotonic() + wait_parked_s
        while applier.gate.parked_count and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            await applier.tick()
        if not active and applier.gate.parked_count:
            report.causes_missing = await _settle_parked(applier, committer, marks, naming, clock, settings)
        _advance(cp, applier, read_pos)
    finally:
        totals = applier.summary()
        c = committer.counts
        cp.add(
            counts
            | {
                "applied": c.applied,
                "duplicates": totals.get("duplicates", 0) + c.in_log + c.by_offset,
                "stale": c.stale,
                "dead_lettered": totals.get("dead_lettered", 0),
            }
        )
        cp.parked = applier.gate.parked_count
        cp.last_run_read, cp.last_run_s = counts["read"], time.monotonic() - started
        await store.save(cp)
        report.read_this_run = counts["read"]
        await consumer.stop()
        await dlq.stop()
        await marks.close()
        await dead_marks.close()
        await nessie.aclose()
    if report.causes_missing:
        report.notes.append(
            f"{report.causes_missing} event(s) waited for a cause that is neither in the range nor on the branch: "
            "dead-lettered as cause-missing (`causeway dlq list --reason cause-missing`)"
        )
    if cp.parked:
        report.notes.append(
            f"{cp.parked} event(s) still wait for a cause outside the range; their partitions resume "
            "at the first of them (run again, or widen the range to include the causes)"
        )
    report.seconds = time.monotonic() - started
    return report


class DependencyDown(ReplayError):
    """A dependency stayed down during a replay; the run stopped and saved its checkpoint."""

    def __init__(self, dependency: str, seconds: float) -> None:
        super().__init__(
            f"{dependency} stayed unreachable for {seconds:.0f}s during the replay; stopped with the checkpoint "
            f"saved: run the same command again once {dependency} is back (`causeway doctor`)"
        )
        self.dependency = dependency


class OutageWatch(Metrics):
    """The applier's metrics, also remembering since when each dependency has been failing."""

    def __init__(self) -> None:
        super().__init__()
        self.down_since: dict[str, float] = {}

    def dependency(self, name: Dependency, up: bool) -> None:
        super().dependency(name, up)
        if up:
            self.down_since.pop(name, None)
        else:
            self.down_since.setdefault(name, time.monotonic())

    def down_for(self, now: float) -> tuple[str, float] | None:
        """The dependency down the longest and for how long, or None."""
        if not self.down_since:
            return None
        name, since = min(self.down_since.items(), key=lambda kv: kv[1])
        return name, now - since


class SkippableClock:
    """``time.monotonic`` that can jump ahead: the end of a replay expires the causal waits at once."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead

    def skip(self, seconds: float) -> None:
        self.ahead += seconds


async def _settle_parked(
    applier: Applier,
    committer: ReplayCommitter,
    marks: AppliedMarks,
    naming: WorldNaming,
    clock: SkippableClock,
    settings: Settings,
) -> int:
    """After the whole range was read: release events whose cause is on the branch (its mark had
    expired or was lost: repaired here), then dead-letter the rest as ``cause-missing`` — no record
    of this replay can bring their cause. Returns how many were dead-lettered."""
    causes = applier.gate.unknown_causes()
    found: set[tuple[str, str]] = set()
    for world in {w for w, _ in causes}:
        ids = [i for w, i in causes if w == world]
        in_log = await asyncio.to_thread(committer.event_ids_in_log, naming.branch(world), ids)
        found |= {(world, i) for i in in_log}
    if found:
        await marks.mark(found)
        await applier.tick()
        await applier.flush_all()
    before = applier.totals.get("dead_lettered", 0)
    clock.skip(settings.causal_timeout_s + 1.0)
    await applier.tick()
    await applier.flush_all()
    return applier.totals.get("dead_lettered", 0) - before


def _advance(cp: Checkpoint, applier: Applier, read_pos: dict[tuple[str, int], int]) -> None:
    for tp, pos in read_pos.items():
        first = applier.tracker.committable(tp) if applier.tracker.in_flight(tp) else None
        cp.advance(tp, next_offset(pos, first))


def _select(
    spec: ReplaySpec, kind: EntityKind | None, rec: object, max_bytes: int, counts: dict[str, int]
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]] | None:
    """The (key, value, headers) to feed for one consumed record, or None when it is left out.

    Invalid records are left out: they were dead-lettered when first read, and a second dead letter
    would only duplicate the first (``causeway dlq`` is the way to deal with them).
    """
    key, value = rec.key, rec.value  # type: ignore[attr-defined]
    headers = list(rec.headers or [])  # type: ignore[attr-defined]
    result = decode(value, key, kind, max_bytes)
    if isinstance(result, Invalid):
        counts["invalid_skipped"] += 1
        return None
    if not spec.selects(result):
        counts["filtered_out"] += 1
        return None
    if spec.into_world:
        event = rewrite(result, spec.into_world)
        return event.key.encode(), event.encode(), headers
    return key, value, headers
