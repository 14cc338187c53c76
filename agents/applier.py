"""The change applier: decoded records in, one atomic commit per world per flush out, offsets acked.

This class owns the order of a flush and nothing Kafka-specific: the worker (``agents/worker.py``)
feeds it records with an opaque handle each and acks the handles it returns, in offset order.

Per input batch:
  1. decode + validate (bad → dead letter), unknown worlds by policy;
  2. one pipelined Redis round trip: are these events (and the causes parked events wait for)
     already applied? duplicates are settled at once;
  3. the causal gate parks, orders and releases; released events join their world's batch;
  4. a world's batch flushes when big or old enough: one Nessie commit (the committer re-checks the
     branch's recorded offsets and versions against the head it commits on) → Redis marks →
     the gate learns what took effect → offsets are done → handles are acked in order.
A failed flush keeps its events and retries with capped backoff while consumption waits: a Nessie
or Redis outage pauses the worker (log line + metric) instead of losing data or spinning. A retry
gives up (``StepAbandoned``) once ``keep_trying`` says no (the worker stops, or a revoke waits):
the applier then forgets its in-memory work and the records are re-read by the next owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn, Protocol, TypeVar

from agents import faults
from agents.batching import BatchAccumulator, CpuLoad
from agents.causal import CAUSE_MISSING, CausalGate, Rejected
from agents.dedupe import drop_duplicates, refs_to_check
from agents.flushing import FlushScheduler
from agents.letter_marks import Decisions, DecisionStore, letter_key, redrive_count, split_replays, world_lookups
from agents.offset_tracker import Arrival, EventRef, OffsetTracker, arrival_at
from agents.readtime import ReadTime, to_pause
from models.deadletter import DeadLetter
from models.errors import WorkerError
from models.events import EntityKind, Invalid, decode
from monitoring.metrics import Dependency, Metrics
from sinks.committed_offsets import PartitionId
from sinks.committer import Batch, CommitOutcome
from sinks.errors import (
    NessieAuthError,
    NessieConflict,
    NessieNotFound,
    NessieUnavailable,
    RetriesExhausted,
    TableUnreadable,
)
from streams.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

UNKNOWN_WORLD = "unknown-world"
STALE_VERSION = "stale-version"
COMMIT_FAILED = "commit-failed"
#: The world's branch points at table files that are gone (``sinks.errors.TableUnreadable``).
WORLD_UNREADABLE = "world-unreadable"

#: Failures a flush waits out (retried with backoff for as long as they last): Nessie or the
#: warehouse unreachable, an unknown outcome, OCC contention. Any other error is taken as a
#: property of the batch: after ``Applier.commit_failure_attempts`` tries it is bisected and the
#: event that cannot be committed is dead-lettered (``commit-failed``).
TRANSIENT: tuple[type[BaseException], ...] = (NessieUnavailable, NessieConflict, NessieAuthError, OSError, TimeoutError)

#: The name of a poll's marks lookup task started beside its dead-letter lookup.
EARLY_LOOKUP = "marks lookup"

#: While a dependency keeps failing, ``Applier._retry`` asks ``keep_trying`` at least this often.
GIVE_UP_CHECK_S = 0.25


async def _readable(read: Callable[[], Awaitable[T]], empty: T) -> T:
    """A branch read (mark repair, cause lookup) of a world whose files are missing answers
    ``empty``: its events are dead-lettered at commit (``world-unreadable``). The sinks' reads
    raise ``TableUnreadable`` for a missing file, never pyiceberg's FileNotFoundError (an OSError,
    which ``_retry`` would wait out as an outage until give-up)."""
    try:
        return await read()
    except TableUnreadable as exc:
        log.warning("branch read failed, a file is missing: %s", exc)
        return empty


class StepAbandoned(WorkerError):
    """A retry gave up because ``Applier.keep_trying`` said no (the worker stops, or a rebalance is
    taking its partitions). The applier has forgotten everything in memory and refuses records until
    partitions are assigned again; nothing of the abandoned work was acked or marked done."""


# Not frozen: a frozen dataclass sets each field through ``object.__setattr__``, and one record a
# polled event at 8 fields cost ~5 µs against ~1 µs (in-process, load 5; 2-3 % of the event loop's
# samples in ``bench.hotpath``). Nothing assigns to a record after the intake builds it.
@dataclass(slots=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
    handle: Any  # what the worker acks (a Faust event); opaque here
    generation: int | None = None  # consumer-group generation it was fetched in, when the intake knows it

    @property
    def tp(self) -> PartitionId:
        return (self.topic, self.partition)


class Marks(Protocol):
    async def applied(self, pairs: Any) -> set[tuple[str, str]]: ...
    async def mark(self, pairs: Any) -> int: ...


class Committer(Protocol):
    async def commit_batch_async(self, batch: Batch) -> CommitOutcome: ...


class DeadLetters(Protocol):
    async def publish(self, letters: Sequence[DeadLetter]) -> None: ...


class Worlds(Protocol):
    async def exists(self, world_id: str) -> bool: ...
    async def ensure(self, world_id: str) -> None: ...


RecentIds = Callable[[str], Awaitable[list[str]]]
#: Confirms this worker is still a member of its consumer group's current generation, owning the
#: given partitions (the intake: a synchronous offset commit the coordinator checks); False when
#: the membership is lost. Asked before a decision the clock makes (a causal expiry): a member
#: whose session expired without it noticing (a zombie) must not dead-letter what the partition's
#: next owner may apply (docs/architecture.md, "A timed decision is fenced by membership").
Fence = Callable[[Collection[PartitionId]], Awaitable[bool]]
# Mark repair writes this many ids per Redis call, yielding to the event loop between calls.
REPAIR_MARK_SLICE = 10_000


class Applier:
    def __init__(
        self,
        settings: Settings,
        *,
        marks: Marks,
        committer: Committer,
        dead_letters: DeadLetters,
        worlds: Worlds,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        worker_id: str | None = None,
        recent_event_ids: RecentIds | None = None,
        pipelined: bool = False,
        commit_failure_attempts: int = 3,
        dead_marks: DecisionStore | Decisions | None = None,
        fence: Fence | None = None,
        cpu_clock: Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings
        self.marks = marks
        self.committer = committer
        self.dlq = dead_letters
        # Dead-letter decisions (agents.letter_marks.Decisions); None: decided again on redelivery.
        if dead_marks is not None and not isinstance(dead_marks, Decisions):
            # The DLQ publisher reads its topic back for decisions a killed worker left pending.
            dead_marks = Decisions(dead_marks, getattr(dead_letters, "letter_keys_since", None))
        self.dead_marks = dead_marks
        self.worlds = worlds
        self.metrics = metrics
        self.clock = clock
        self.worker_id = worker_id or uuid.uuid4().hex[:8]
        self.gate = CausalGate(settings.causal_timeout_s, settings.max_parked)
        self.tracker = OffsetTracker()
        # A world's batch is due at ``batch_flush_events``: its commit then overlaps the intake of
        # the next polls instead of starting after several of them (``batch_max_events`` is the
        # poll, and bounds what is buffered).
        self.batches: BatchAccumulator[Arrival] = BatchAccumulator(
            min(settings.batch_flush_events, settings.batch_max_events),
            settings.batch_max_seconds,
            settings.batch_idle_min_seconds,
        )
        self.lock = asyncio.Lock()
        self._handles: dict[PartitionId, deque[tuple[int, Any]]] = defaultdict(deque)
        self._known_worlds: set[str] = set()
        # The per-world gauges as last exported (parked, in flight, since) and the worlds that had
        # events in flight then (``_export_gauges``).
        self._gauges_shown: dict[str, tuple[int, int, float | None]] = {}
        self._gauges_busy: set[str] = set()
        # Events the gate is holding: when they were parked and from which partition.
        self._parked_at: dict[tuple[str, str], tuple[float, PartitionId]] = {}
        # In-flight records by offset: dead letters carry the producer's exact bytes and headers.
        self._records: dict[PartitionId, dict[int, RawRecord]] = defaultdict(dict)
        self._batch_seq = 0
        self._kinds = {settings.objects_topic: EntityKind.OBJECT, settings.links_topic: EntityKind.LINK}
        self.totals: dict[str, int] = defaultdict(int)
        self._recent_event_ids = recent_event_ids
        self.commit_failure_attempts = commit_failure_attempts
        self._repaired: set[str] = set()
        # Worlds whose last flush found their files missing: one commit attempt per flush, not
        # ``commit_failure_attempts`` with backoff, until a commit succeeds (the world was repaired).
        self._unreadable: set[str] = set()
        # The process's CPU clock (``time.process_time``): a busy worker's idle flushes wait longer
        # (``BatchAccumulator.stretch``, ``CAUSEWAY_BATCH_BUSY_CPU``). None: never stretched.
        self.cpu_clock = cpu_clock
        self.cpu_load = CpuLoad()
        # The intake's last poll was not full: buffered batches are flushed without waiting.
        self.idle = False
        # The intake's last poll was full (a backlog): a missing cause is most likely still in it,
        # so its branch lookup waits longer (``_look_up_causes``). ``caught_up_at``: when it last
        # stopped being behind; batches started before then hold the rest of a backlog.
        self._behind = False
        self.caught_up_at: float | None = None
        # Pipelined (the worker): due worlds commit and settle in the background, without the lock.
        self.flusher: FlushScheduler | None = None
        if pipelined:
            self.flusher = FlushScheduler(
                self._flush_in_background,
                lambda: self.batches.due(self.clock(), self.idle, self.caught_up_at),
                self.batches.worlds,
                budget=settings.flush_commit_budget,
            )
        # Causes Redis does not know: when first seen unknown, and when last looked up on the branch.
        self._cause_seen: dict[tuple[str, str], float] = {}
        self._cause_checked: dict[tuple[str, str], float] = {}
        # The branch lookup of causes in flight (``_look_up_causes``): it runs beside the intake's
        # steps, not inside one, and only one at a time.
        self._cause_lookup: asyncio.Task[None] | None = None
        # Asked while a dependency keeps failing: False gives the step up (``StepAbandoned``) so the
        # caller's lock is released. The intake says False while it stops or a revoke waits for it.
        self.keep_trying: Callable[[], bool] = lambda: True
        # None: no consumer group to fence by (tests, replay); the intake sets its own.
        self.fence = fence
        # How far the intake has read in record time (``agents.readtime``); None: not known, a
        # parked event's timeout is wall time alone. The intake sets its own when it starts.
        self.reading: ReadTime | None = None

    @property
    def behind(self) -> bool:
        return self._behind

    @behind.setter
    def behind(self, value: bool) -> None:
        if self._behind and not value:
            self.caught_up_at = self.clock()
        self._behind = value

    # --- input ----------------------------------------------------------------------------------

    @asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        """The applier's lock, for a step of the intake, a tick, a final flush or a revoke.

        A step that gives up (``StepAbandoned``) forgets all in-memory work here, before the lock
        is released: the forgetting happens only under the lock, never inside another step's await
        (a poll awaiting its dedupe lookup would otherwise go on into a fresh gate with records of
        partitions just fenced). Pipelined flushes run without the lock and forget through it too
        (``_flush_in_background``)."""
        async with self.lock:
            try:
                yield
            except StepAbandoned:
                self._abandon()
                raise

    async def process(self, records: Sequence[RawRecord]) -> list[Any]:
        """Take a batch of consumed records; returns the handles to ack now, in offset order."""
        async with self._exclusive():
            now = self.clock()
            arrivals: list[Arrival] = []
            dead: list[DeadLetter] = []
            # Redrive counts of the records that have one (a header ``dlq redrive`` sets): most have none.
            redrives: dict[tuple[str, int, int], int] = {}
            consumed, handles, in_flight = self.tracker.consumed, self._handles, self._records
            kinds, max_bytes = self._kinds, self.settings.max_event_bytes
            # A poll comes in runs of one partition: its key, queues and topic kind are looked up
            # once a run, not once a record (the queues once it has a record taken).
            topic, partition, tp, kind = "", -1, ("", -1), None
            handled: deque[tuple[int, Any]] | None = None
            held: dict[int, RawRecord] = {}
            for rec in records:
                offset = rec.offset
                if rec.partition != partition or rec.topic != topic:
                    topic, partition = rec.topic, rec.partition
                    tp, kind, handled = (topic, partition), kinds.get(topic), None
                if not consumed(tp, offset, rec.generation):
                    continue  # a re-fetch, or fetched before a rebalance that took its partition
                if handled is None:
                    handled, held = handles[tp], in_flight[tp]
                handled.append((offset, rec.handle))
                held[offset] = rec
                result = decode(rec.value, rec.key, kind, max_bytes)
                if isinstance(result, Invalid):
                    dead.append(self._letter(rec, result.reason, result.detail, result.event_id, result.world_id))
                else:
                    arrivals.append(arrival_at(result, topic, partition, offset))
                    if rec.headers and (n := redrive_count(rec.headers)):
                        redrives[(topic, partition, offset)] = n
            self.totals["consumed"] += len(records)
            for topic, n in Counter(rec.topic for rec in records).items():
                self.metrics.consumed(topic, n)  # per batch: a labels() lookup per record cost ~16% of process()
            marked = self._look_up_marks_early(arrivals)
            try:
                arrivals, dead = await self._settle_replays(arrivals, dead, redrives)
                arrivals = await self._check_worlds(arrivals, dead)
            except BaseException:
                if marked is not None:
                    marked.cancel()
                    await asyncio.gather(marked, return_exceptions=True)
                raise
            await self._dedupe_and_gate(arrivals, now, marked)
            self._look_up_causes(now)
            self._collect_gate_output(dead)
            await self._publish_dead(dead)
            await self._flush_due(now)
            return self._acks_due()

    async def tick(self) -> list[Any]:
        """Periodic work: expire waits, learn causes applied elsewhere, flush old batches."""
        async with self._exclusive():
            now = self.clock()
            if self.cpu_clock is not None and self.settings.batch_busy_cpu > 0:
                self.batches.stretch(self.cpu_load.observe(now, self.cpu_clock()), self.settings.batch_busy_cpu)
            read_time = self._read_time()
            self._look_up_causes(now)
            if self.gate.expiring(now, read_time):
                await self.causes_looked_up(now)  # the last look at a cause comes before its effects expire
            if self.gate.unknown_causes():
                await self._dedupe_and_gate([], now)  # before expiring: a cause marked meanwhile releases
            if await self._expiry_fenced(now, read_time):
                self.gate.expire(now, read_time)
            dead: list[DeadLetter] = []
            self._collect_gate_output(dead)
            await self._publish_dead(dead)
            await self._flush_due(now)
            self._export_gauges()
            return self._acks_due()

    async def flush_all(self) -> list[Any]:
        """Commit everything released (before a partition is given up, or at shutdown)."""
        if self.flusher is not None:
            await self.flusher.drain()
        if self._cause_lookup is not None:
            await self._cause_lookup  # gives up at its next failure while the worker stops or a revoke waits
        async with self._exclusive():
            await asyncio.gather(*(self._flush(world) for world in list(self.batches.worlds())))
            return self._acks_due()

    async def revoke(self, tps: Sequence[PartitionId]) -> None:
        """Give partitions up: released events are committed first, parked ones dropped (re-read later).

        Whatever the gate rejected meanwhile is dead-lettered before the partitions' records are
        forgotten (a letter carries the producer's bytes and headers); a letter of a revoked
        partition is settled by its recorded decision when the next owner re-reads it.
        """
        await self.flush_all()
        async with self._exclusive():
            dropped = {tp: self.gate.revoke(tp) for tp in tps}
            await self._drain_gate()
            self._forget(tps, dropped, "revoked")

    def _forget(self, tps: Iterable[PartitionId], dropped: dict[PartitionId, int], why: str) -> None:
        """Forget partitions whose parked events the gate dropped: nothing of theirs is acked or
        marked done afterwards, and their records are refused until they are assigned again."""
        for tp in tps:
            self.tracker.revoke(tp, fence=True)  # late records of the old assignment are refused
            self._handles.pop(tp, None)
            self._records.pop(tp, None)
            for ref in [r for r, (_, src) in self._parked_at.items() if src == tp]:
                del self._parked_at[ref]
            if dropped[tp]:
                log.info(
                    "%s %s[%d]: dropped %d parked event(s); the new owner re-reads them",
                    why,
                    tp[0],
                    tp[1],
                    dropped[tp],
                )

    async def _expiry_fenced(self, now: float, read_time: float = float("inf")) -> bool:
        """May the gate expire what is due now? Asks ``fence`` once for all the partitions whose
        parked events would expire (nothing is asked when none would). Refused (the membership is
        lost): nothing expires here, and those partitions are forgotten like a revoke (the
        rebalance that follows a lost membership hands them out again, re-read from the committed
        offset), so this worker neither dead-letters nor releases anything of theirs."""
        fence = self.fence
        if fence is None:
            return True
        tps = self.gate.expiring(now, read_time)
        if not tps:
            return True
        if await self._retry("membership fence", partial(fence, tps), "kafka"):
            return True
        dropped = {tp: self.gate.revoke(tp) for tp in sorted(tps)}
        self._forget(sorted(tps), dropped, "membership lost before expiring parked events of")
        self.totals["expiries_fenced"] += sum(dropped.values())
        log.warning(
            "membership fence refused: %d parked event(s) due to expire were dropped, not dead-lettered; "
            "the partitions' next owner re-reads them",
            sum(dropped.values()),
        )
        return False

    @property
    def backpressure(self) -> bool:
        # Batches keep growing while their world's commit is in flight: bound them too. Records wait
        # for their ack behind the oldest unsettled offset of their partition: bound those as well.
        return self._held_back() or self._batches_full()

    def _batches_full(self) -> bool:
        return self.batches.size() >= 3 * self.settings.batch_max_events

    def _held(self) -> int:
        return sum(map(len, self._handles.values()))

    def _held_back(self) -> bool:
        """Reading is held back by what parked events hold: the gate is full, or the records waiting
        for their ack behind them (a parked event holds its partition's later offsets) reach
        their bound. Commits do not clear it; only a release or an expiry does."""
        return self.gate.full or self._held() >= self.settings.max_unacked_records

    def _stalled(self) -> bool:
        """Held back past memory's hard bound (the gate full, or twice ``max_unacked_records``
        held): every partition is paused, so the read time cannot move until something expires."""
        return self.gate.full or self._held() >= 2 * self.settings.max_unacked_records

    def to_pause(self, assigned: Collection[PartitionId]) -> set[PartitionId]:
        """The assigned partitions the intake pauses now (``agents.readtime.to_pause``): held back
        below the hard bound, only those read ahead of the others; with no read time known to
        align by, lagging commits, or past the hard bound, all of them."""
        held_back = self._held_back()
        ceiling = self._stalled() or self._batches_full() or (held_back and self.reading is None)
        times = self.reading.times(time.time()) if self.reading is not None and held_back else {}
        return to_pause(assigned, times, held_back=held_back, ceiling=ceiling)

    def _read_time(self) -> float:
        """The read time the gate's expiry waits for (``agents.readtime``): +inf, the wall-time
        rule alone, when the intake's reading is not known or when everything is paused by the
        parked events themselves (past the hard bound the watermark cannot move until something
        expires: waiting on it would stall the worker for good; memory stays bounded and those
        letters are redrivable). Held back below that bound, the least-read partitions are still
        read (``to_pause``), so the watermark moves and counts."""
        if self.reading is None or self._stalled():
            return float("inf")
        return self.reading.watermark(time.time())

    # --- steps ----------------------------------------------------------------------------------

    def _letter(
        self,
        rec: RawRecord | Arrival,
        reason: str,
        detail: str,
        event_id: str | None = None,
        world_id: str | None = None,
    ) -> DeadLetter:
        if isinstance(rec, Arrival):
            key, value, headers = self._raw_of(rec)
            event_id, world_id = rec.event.event_id, rec.event.world_id
        else:
            key, value, headers = rec.key, rec.value, rec.headers
        # A redriven record that fails again keeps its history: first sighting and redrive count.
        previous = DeadLetter.from_record(key, value, list(headers))
        return DeadLetter(
            reason,
            detail,
            rec.topic,
            rec.partition,
            rec.offset,
            key,
            value,
            event_id,
            world_id,
            first_seen_ms=previous.first_seen_ms or int(time.time() * 1000),
            redrive_count=previous.redrive_count,
            original_headers=list(headers),
        )

    def _raw_of(self, arrival: Arrival) -> tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes]]]:
        rec = self._records.get(arrival.tp, {}).get(arrival.offset)
        if rec is not None:
            return rec.key, rec.value, rec.headers
        # Not in flight here (should not happen): the contract round-trips, so re-encode.
        return arrival.event.key.encode(), arrival.event.encode(), ()

    async def _settle_replays(
        self,
        arrivals: list[Arrival],
        dead: list[DeadLetter],
        redrives: dict[tuple[str, int, int], int] | None = None,
    ) -> tuple[list[Arrival], list[DeadLetter]]:
        """Settle records dead-lettered before (then redelivered: a crash before their offset was
        committed; or a producer-retry copy of a dead-lettered event) without deciding them again;
        one Redis round trip per batch (``agents.letter_marks``). ``redrives``: the redrive count
        of each arrival's origin that has one."""
        if self.dead_marks is None or not (arrivals or dead):
            return arrivals, dead
        redrives = redrives or {}
        keys = [letter_key(dl) for dl in dead]
        # The decoded records' keys go per world, as parts the lookup script joins (``WorldLookup``).
        worlds = world_lookups(arrivals, redrives)
        decisions = self.dead_marks
        recorded = await self._retry("redis dead-letter lookup", lambda: decisions.taken(keys, worlds), "redis")
        if not recorded:
            return arrivals, dead
        split = split_replays(arrivals, dead, recorded, redrives)
        for world, (topic, partition, offset) in split.replayed:
            self.tracker.done((topic, partition), offset)
            self._let_go((topic, partition), offset)
            self.metrics.event_outcome(world, "dead_letter_replay")
        self.totals["dead_letter_replays"] += len(split.replayed)
        return split.arrivals, split.letters

    async def _check_worlds(self, arrivals: list[Arrival], dead: list[DeadLetter]) -> list[Arrival]:
        worlds = {a.event.world_id for a in arrivals} - self._known_worlds
        for world in worlds:
            if await self._retry(f"check world {world}", partial(self.worlds.exists, world), "nessie"):
                self._known_worlds.add(world)
            elif self.settings.unknown_world_policy == "create":
                await self._retry(f"create world {world}", partial(self.worlds.ensure, world), "nessie")
                log.info(
                    "created world %s from %s (unknown-world policy 'create')",
                    world,
                    self.settings.main_branch,
                )
                self._known_worlds.add(world)
        for world in {a.event.world_id for a in arrivals} & self._known_worlds - self._repaired:
            await self._repair_marks(world)
        kept = []
        for a in arrivals:
            if a.event.world_id in self._known_worlds:
                kept.append(a)
            else:
                dead.append(
                    self._letter(
                        a,
                        UNKNOWN_WORLD,
                        f"world {a.event.world_id!r} has no branch; create it with "
                        f"`causeway worlds create {a.event.world_id}`",
                    )
                )
        return kept

    async def _repair_marks(self, world: str) -> None:
        """Re-mark the newest batches of a world's branch before deduping its events.

        A crash between a Nessie commit and its Redis marks leaves those events unmarked; a
        redelivered copy at another offset (a producer retry) would then reach the committer
        again. Done once per world per partition assignment, since after a rebalance the crashed
        worker's batches may be ours to guard. Depth (20 commits) is an optimisation: the committer
        stops older copies (recorded offsets, version check, then event ids in the log; for types a
        TRUNCATE cleared, event ids before the version check: docs/architecture.md, "Mark repair depth").
        """
        if self._recent_event_ids is None:
            return
        recent = self._recent_event_ids
        none: list[str] = []
        read = partial(_readable, partial(recent, world), none)
        ids = await self._retry(f"mark repair for world {world}", read, "nessie")
        # In slices: a branch whose newest commits are big (a bulk load, a rebuild) can hold a
        # million ids, and one call that size held the event loop and Redis long enough to lose
        # the consumer group's heartbeat (seen at 1M ids: the worker settled nothing for 60 s).
        for start in range(0, len(ids), REPAIR_MARK_SLICE):
            pairs = [(world, i) for i in ids[start : start + REPAIR_MARK_SLICE]]
            await self._retry("redis mark", partial(self.marks.mark, pairs), "redis")
        self._repaired.add(world)

    def on_assigned(self, tps: Sequence[PartitionId] | None = None, generation: int | None = None) -> None:
        """A rebalance gave us partitions: take their records again, check marks again on first touch.

        ``tps``: the partitions now assigned (None: every revoked one); ``generation``: the group
        generation they belong to, when the intake tags records with it (``RawRecord.generation``).
        A partition revoked earlier refuses records until it is assigned here.
        """
        self._repaired.clear()
        for tp in self.tracker.fenced() if tps is None else tps:
            if not self.tracker.is_tracked(tp):
                self.tracker.assign(tp, None, generation)

    def _look_up_marks_early(self, arrivals: list[Arrival]) -> asyncio.Task[set[EventRef]] | None:
        """The marks lookup of a poll, started beside its dead-letter lookup instead of after it.

        The two lookups were a poll's two sequential Redis round trips: ~0.15-0.25 s of wall time in a
        10,000-record poll's 0.3-0.4 s (the event loop is shared, so most of it is other work run
        while waiting). Together, Redis runs one while the worker packs, parses or decodes: the
        drain's five large polls took 1.60-1.74 s against 2.04-2.06 s in three alternated pairs
        (docs/benchmarks.md, "2026-12-03 late morning").
        It asks for a superset (the arrivals the dead-letter lookup will settle as replays too):
        every mark it returns is a fact, and only the survivors' are used to drop duplicates.
        Not when a world of the poll is new to this worker: its marks are repaired from its branch
        (``_check_worlds``) first, and the lookup must see them.
        """
        if not arrivals or self.dead_marks is None:
            return None
        ready = self._known_worlds if self._recent_event_ids is None else self._repaired
        if any(a.event.world_id not in ready for a in arrivals):
            return None
        refs = refs_to_check(arrivals, self.gate.unknown_causes())
        return asyncio.get_running_loop().create_task(self._marked(refs), name=EARLY_LOOKUP)

    async def _marked(self, refs: list[EventRef]) -> set[EventRef]:
        """The refs Redis holds a mark for (retried while Redis is down)."""
        if not refs:
            return set()
        return await self._retry("redis dedupe lookup", lambda: self.marks.applied(refs), "redis")

    async def _dedupe_and_gate(
        self, arrivals: list[Arrival], now: float, early: asyncio.Task[set[EventRef]] | None = None
    ) -> None:
        if early is not None:
            marked = await early
        else:
            marked = await self._marked(refs_to_check(arrivals, self.gate.unknown_causes()))
        self.metrics.dependency("redis", True)
        split = drop_duplicates(arrivals, marked)
        lookups = Counter([a.ref[0] for a in arrivals])  # counted in C: a Python loop cost ~0.3 µs an event
        dups = Counter([a.ref[0] for a in split.duplicates])
        for a in split.duplicates:
            self._settle(a)
        for world, n in lookups.items():
            self.metrics.idempotency(world, lookups=n, duplicates=dups[world])
            if dups[world]:
                self.metrics.event_outcome(world, "duplicate", dups[world])
        self.totals["duplicates"] += len(split.duplicates)
        if marked:
            # Every marked ref counts: causes of new arrivals as well as of parked events.
            self.gate.learn_applied(marked)
        parked: dict[str, int] = defaultdict(int)
        at = self.reading.at if self.reading is not None else None
        for a in self.gate.offer_all(split.fresh, now, at):  # fast path: no cause, nothing parked on the key
            self._parked_at[a.ref] = (now, a.tp)
            parked[a.event.world_id] += 1
        for world, n in parked.items():
            self.metrics.event_outcome(world, "parked", n)

    def _look_up_causes(self, now: float) -> None:
        """Causes parked events wait for that Redis does not know: look them up in the branch's log.

        A mark may be gone (TTL, Redis data loss) or never made (a fork inherits history, not
        marks); the branch's event log is the source of truth (issue 12, case 5). A cause is looked
        up once it has been unknown for a short grace (most late causes simply arrive; a quarter of
        the causal timeout while the intake is behind), then again at most every half causal
        timeout, so the last look comes before its effects time out (``tick`` waits for a lookup
        in flight before it expires anything).

        The lookup runs as a task beside the intake (``_find_causes``), one at a time: awaited
        inside a step, it held the applier's lock, and the intake with it, for the log's read (a
        soak at 5,000/s: the intake stalled while it found nothing, the causes were still in the
        backlog). What it finds is re-marked in Redis and learned by the gate; the next step or
        tick releases the effects.
        """
        lookup = getattr(self.committer, "applied_events_async", None)
        if lookup is None:
            return
        task = self._cause_lookup
        if task is not None:
            if not task.done():
                return  # what is due now is looked up by the next call after this one
            self._cause_lookup = None
            task.result()  # a lookup that failed unexpectedly fails the worker here, not silently
        unknown = self.gate.unknown_causes()
        for table in (self._cause_seen, self._cause_checked):
            for ref in [r for r in table if r not in unknown]:
                del table[ref]
        timeout = self.settings.causal_timeout_s
        grace, recheck = min(1.0, timeout / 4), timeout / 2
        if self.behind:
            # A full poll means a backlog: a cause unknown for a second is most likely still in it
            # (another partition), and each lookup plans the world's log and reads the files not
            # yet filtered (measured before the log's lookups went by file filters: 13 lookups,
            # 1.45 s of intake stalled, none found, in one small-profile run). The first look
            # waits a quarter of the timeout; the recheck at half the timeout still comes before
            # the effects expire.
            grace = timeout / 4
        due: dict[str, set[str]] = defaultdict(set)
        for ref in unknown:
            seen = self._cause_seen.setdefault(ref, now)
            checked = self._cause_checked.get(ref)
            if now - seen >= grace and (checked is None or now - checked >= recheck):
                due[ref[0]].add(ref[1])
                self._cause_checked[ref] = now
        if due:
            self._cause_lookup = asyncio.get_running_loop().create_task(self._find_causes(lookup, due))

    async def causes_looked_up(self, now: float) -> None:
        """Wait for the lookup in flight, then for the one due by ``now`` (``_look_up_causes``)."""
        for _ in range(2):
            task = self._cause_lookup
            if task is not None:
                await task
            self._look_up_causes(now)

    async def _find_causes(
        self, lookup: Callable[[str, set[str]], Awaitable[set[str]]], due: dict[str, set[str]]
    ) -> None:
        """Look ``due`` causes up in their worlds' logs; mark and learn those applied there.

        Runs without the applier's lock, like a pipelined flush's settle: the gate learns in one
        synchronous call, and learning that a cause took effect is a fact whichever gate hears it
        (a gate rebuilt by ``_abandon`` meanwhile included). Giving up (stopping, a revoke) loses
        nothing: the causes stay unknown and are looked up again.
        """
        none: set[str] = set()
        try:
            for world, ids in due.items():
                read = partial(_readable, partial(lookup, world, ids), none)
                found = await self._retry(f"cause lookup in world {world}", read, "nessie")
                if found:
                    refs = [(world, i) for i in found]
                    await self._retry("redis mark", partial(self.marks.mark, refs), "redis")
                    self.gate.learn_applied(refs)
        except StepAbandoned:
            log.info("cause lookup given up (stopping or partitions revoked); looked up again later")

    def _collect_gate_output(self, dead: list[DeadLetter]) -> None:
        out = self.gate.drain()
        now = self.clock()
        waited: dict[str, list[float]] = defaultdict(list)
        add, parked_at = self.batches.add, self._parked_at
        for a in out.ready:
            world = a.event.world_id
            add(world, a, now)
            if parked_at:  # most polls park nothing: no lookup per released event then
                held = parked_at.pop(a.ref, None)
                if held is not None:
                    waited[world].append(now - held[0])
        for world, waits in waited.items():
            self.metrics.released(world, waits)
        for rej in out.dead:
            self._parked_at.pop(rej.arrival.ref, None)
            dead.append(self._rejected_letter(rej))
        for a in out.duplicates:
            self._parked_at.pop(a.ref, None)
            self.metrics.event_outcome(a.event.world_id, "duplicate")
            self.totals["duplicates"] += 1
            self._settle(a)

    async def _drain_gate(self) -> None:
        """Collect the gate's output outside intake and ticks (after a commit, at a revoke): its
        rejections are dead-lettered here, never dropped (a dropped one would hold its partition's
        offset back for good, or lose the decision)."""
        dead: list[DeadLetter] = []
        self._collect_gate_output(dead)
        await self._publish_dead(dead)

    def _rejected_letter(self, rej: Rejected) -> DeadLetter:
        return self._letter(rej.arrival, rej.reason, rej.detail)

    async def _publish_dead(self, dead: list[DeadLetter]) -> None:
        if not dead:
            return
        decisions = self.dead_marks
        keys: list[str] = []
        if decisions is not None:
            # Pending first: a worker killed after the broker confirmed the letters but before the
            # decision is confirmed leaves it pending, and the next owner looks for the letters in
            # the DLQ instead of deciding again (one letter per origin in every interleaving).
            now_ms = int(time.time() * 1000)
            keys = await self._retry("redis dead-letter mark", lambda: decisions.publishing(dead, now_ms), "redis")
        await self._retry("dead-letter publish", lambda: self.dlq.publish(dead), "kafka")
        faults.reached("after-dead-letter")
        if decisions is not None:
            # Confirmed, now durable: a redelivery (offset not yet committed) is settled, not decided again.
            await self._retry("redis dead-letter mark", lambda: decisions.published(keys), "redis")
        for dl in dead:
            self.metrics.dead_lettered(dl.topic, dl.reason, world=dl.world_id)
            self.tracker.done((dl.topic, dl.partition), dl.offset)
            self._let_go((dl.topic, dl.partition), dl.offset)
        self.totals["dead_lettered"] += len(dead)

    def _settle(self, a: Arrival) -> None:
        self.tracker.done(a.tp, a.offset)
        self._let_go(a.tp, a.offset)

    def _settle_all(self, arrivals: Iterable[Arrival]) -> None:
        """Done, and the raw record let go: only a dead letter reads it, and none can follow a
        commit. Its handle stays queued until an older parked offset lets the ack go; the record
        went with it before: behind parked events a lagging ``full`` worker held 164k records, 59 MiB
        of bytes, at least 90k of them committed (its memory probe)."""
        arrivals = list(arrivals)
        self.tracker.done_all(a.source for a in arrivals)
        for a in arrivals:
            self._let_go(a.tp, a.offset)

    def _let_go(self, tp: PartitionId, offset: int) -> None:
        if (held := self._records.get(tp)) is not None:
            held.pop(offset, None)

    async def _flush_due(self, now: float) -> None:
        # Effects released by a commit join the next batch; loop until nothing is due.
        for _ in range(100):
            due = self.batches.due(now, self.idle, self.caught_up_at)
            if self.flusher is not None:
                self.flusher.schedule(due)  # in the background; each flush schedules what is due next
                return
            if not due:
                return
            # Worlds are separate branches: their commits overlap (Nessie round trips, file writes).
            await asyncio.gather(*(self._flush(world) for world in due))

    async def _flush_in_background(self, world: str) -> None:
        """A pipelined flush (``FlushScheduler``): take, commit and settle ``world``'s batch
        **without the applier's lock**, so a returned commit is settled (marks, gate, offsets) and
        the world's next batch starts while the intake holds the lock for a poll.

        Safe because every state change here and in the lock holders is synchronous (one event
        loop thread), the tracker advances only after the commit (acks in offset order), the gate
        releases a parked event once whoever calls ``committed`` first, and what the lock holders
        keep across an await tolerates a settle in between (docs/architecture.md, "Pipelined flush
        and adaptive batching"). A revoke waits for this flush (``FlushScheduler.drain``) before it
        forgets partitions. Giving up forgets in-memory work under the lock (``_exclusive``).
        """
        try:
            await self._flush(world)
        except StepAbandoned:
            async with self.lock:
                self._abandon()
            raise

    async def _flush(self, world: str) -> None:
        started_at = self.batches.started_at(world)
        items = self.batches.take(world)
        if items:
            if started_at is not None:
                self.metrics.flush_started(self.clock() - started_at)
            await self._commit_items(world, items, set())

    async def _commit_items(self, world: str, items: list[Arrival], failed: set[tuple[str, str]]) -> None:
        """Commit ``items`` as one batch; a batch that fails deterministically is halved until the
        event that cannot be committed is alone, which is dead-lettered (``commit-failed``) with the
        effects it released (``failed`` collects them across the halves)."""
        # ``failed`` is empty but for the halves of a failing batch: no pass over every item then.
        orphans = [a for a in items if (a.event.world_id, a.event.caused_by) in failed] if failed else []
        if orphans:
            failed |= {a.ref for a in orphans}
            await self._publish_dead(
                [
                    self._letter(
                        a, CAUSE_MISSING, f"its cause {a.event.caused_by!r} was dead-lettered ({COMMIT_FAILED})"
                    )
                    for a in orphans
                ]
            )
            self.gate.abandoned([a.ref for a in orphans])
            items = [a for a in items if a.ref not in failed]
            if not items:
                return
        self._batch_seq += 1
        batch_id = f"{self.worker_id}-{int(time.time() * 1000)}-{self._batch_seq}"
        # Offsets below each partition's committable offset are done for every world: passing them
        # as floors keeps the branch's recorded offset sets short (see sinks.committer).
        batch = Batch.from_sources(
            world,
            batch_id,
            [(a.event, a.source) for a in items],
            settled=self.tracker.committable_all(),
        )
        started = time.monotonic()
        faults.reached("before-commit")

        failures: list[Exception] = []

        async def commit() -> CommitOutcome | Exception | None:
            try:
                return await self.committer.commit_batch_async(batch)
            except NessieNotFound:
                return None  # the branch is gone: retrying cannot help
            except TRANSIENT:
                raise  # an outage or contention: wait it out, however long
            except Exception as exc:  # noqa: BLE001 - anything else fails the same way every time
                failures.append(exc)
                if len(failures) >= (1 if world in self._unreadable else self.commit_failure_attempts):
                    return exc
                raise

        outcome = await self._retry(
            f"commit of {len(items)} event(s) to world {world}",
            commit,
            "nessie",
            on_error=lambda exc: self.metrics.commit_failed(
                world,
                duration_s=time.monotonic() - started,
                retries_exhausted=isinstance(exc, RetriesExhausted),
            ),
        )
        if isinstance(outcome, TableUnreadable):
            await self._dead_letter_unreadable(world, items, outcome, len(failures), failed)
            return
        self._unreadable.discard(world)
        if isinstance(outcome, Exception):
            if len(items) > 1:
                half = len(items) // 2
                await self._commit_items(world, items[:half], failed)
                await self._commit_items(world, items[half:], failed)
                return
            [a] = items
            log.error("world %s: event %s cannot be committed: %r", world, a.event.event_id, outcome)
            failed.add(a.ref)
            detail = f"commit failed {len(failures)} times: {type(outcome).__name__}: {outcome}"
            await self._publish_dead([self._letter(a, COMMIT_FAILED, detail)])
            self.gate.abandoned([a.ref])
            return
        self.metrics.dependency("nessie", True)
        if outcome is None:
            # Deleted while its events were in flight: dead-letter them (an operator can redrive
            # after re-creating the world) rather than re-creating a world somebody removed.
            self._known_worlds.discard(world)
            self._repaired.discard(world)
            detail = f"world {world!r} has no branch any more (deleted while its events were in flight)"
            await self._publish_dead([self._letter(a, UNKNOWN_WORLD, detail) for a in items])
            # Not applied: they must neither count as causes nor make a redriven copy a duplicate.
            self.gate.abandoned([a.ref for a in items])
            return
        faults.reached("after-commit")
        stale_ids = set(outcome.stale_ids)
        stale = [a for a in items if a.event.event_id in stale_ids] if stale_ids else []
        if stale:
            # Dead letters before marks: a crash in between must not leave a marked event that is
            # neither applied nor dead-lettered (its redelivered copy would be dropped as a duplicate).
            await self._publish_dead(
                [
                    self._letter(
                        a,
                        STALE_VERSION,
                        f"version {a.event.version} of {a.event.entity_type} "
                        f"{a.event.entity_pk!r} is not newer than the stored version",
                    )
                    for a in stale
                ]
            )
        # Dropped by a recorded offset but not on the branch: dead-lettered before (a floor covers
        # it). Settled, never marked, and its effects are not released (issue 12, case 2).
        absent = set(outcome.absent_ids)
        refs = [a.ref for a in items if a.event.event_id not in absent] if absent else [a.ref for a in items]
        await self._retry("redis mark", lambda: self.marks.mark(refs), "redis")
        faults.reached("after-mark")
        self.gate.committed(refs)
        if absent:
            self.gate.abandoned([a.ref for a in items if a.event.event_id in absent])
        self._settle_all([a for a in items if a.event.event_id not in stale_ids] if stale_ids else items)
        dup_ids = outcome.duplicate_ids
        dups = len([a for a in items if a.event.event_id in dup_ids]) if dup_ids else 0
        if dups:
            self.totals["duplicates"] += dups
            self.metrics.event_outcome(world, "duplicate", dups)
        applied = len(items) - len(stale) - len(absent) - dups
        self.totals["applied"] += applied
        self.totals["commits"] += 0 if outcome.already_committed else 1
        self.metrics.event_outcome(world, "applied", applied)
        self.metrics.committed(
            world,
            duration_s=outcome.seconds,
            rows=len(items),
            nbytes=sum(s.bytes_written for s in outcome.stats.values()),
            occurred_at=[a.event.occurred_at_ms / 1000 for a in items],
            outcome="already_committed" if outcome.already_committed else "committed",
            unconverted=sum(s.values_unconverted for s in outcome.stats.values()),
        )
        log.debug(
            "world %s: committed batch %s (%d events) as %s in %.3fs",
            world,
            batch_id,
            len(items),
            outcome.hash[:12],
            outcome.seconds,
        )
        await self._drain_gate()

    async def _dead_letter_unreadable(
        self, world: str, items: list[Arrival], exc: TableUnreadable, attempts: int, failed: set[tuple[str, str]]
    ) -> None:
        """Every event of a world whose files are missing is dead-lettered (no halving: none can
        land), never marked; the other worlds' flushes go on. Redrive after repairing the world."""
        if world not in self._unreadable:
            log.error("world %s is unreadable (%s): dead-lettering its events (%s)", world, exc.path, exc)
        self._unreadable.add(world)
        detail = f"world {world!r} cannot be read: file missing: {exc.path} ({attempts} attempt(s))"
        failed |= {a.ref for a in items}
        await self._publish_dead([self._letter(a, WORLD_UNREADABLE, detail) for a in items])
        self.gate.abandoned([a.ref for a in items])

    async def _retry(
        self,
        what: str,
        call: Callable[[], Any],
        dep: Dependency,
        on_error: Callable[[Exception], None] | None = None,
    ) -> Any:
        """Run ``call`` until it succeeds; back off (capped) and report while ``dep`` is down.

        The dependency gauge goes to 0 on a failure and back to 1 when the same call succeeds, so
        it recovers even when nothing else touches that dependency afterwards. ``dep`` is the
        service ``call`` talks to, stated by the caller (``what`` is only for the log).

        Gives up when ``keep_trying()`` turns False while the call keeps failing (asked after each
        failure and during the backoff): :class:`StepAbandoned` is raised, everything in memory is
        forgotten (``_abandon``, by ``_exclusive`` under the lock) and the step releases its lock at
        once; its records stay unacked for the partitions' next owner. A call that succeeds is never given up.
        """
        delay = 0.2
        attempt = 0
        while True:
            try:
                result = await call()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure here is retried, never lost
                attempt += 1
                if on_error is not None:
                    on_error(exc)
                self.metrics.dependency(dep, False)
                if not self.keep_trying():
                    self._give_up(what, attempt, exc)
                log.warning(
                    "%s failed (attempt %d, retrying in %.1fs): %s: %s",
                    what,
                    attempt,
                    delay,
                    type(exc).__name__,
                    exc,
                )
                await self._backoff(delay, what, attempt, exc)
                delay = min(delay * 2, 10.0)
            else:
                if attempt:
                    self.metrics.dependency(dep, True)
                    log.info("%s succeeded after %d failed attempt(s)", what, attempt)
                return result

    async def _backoff(self, delay: float, what: str, attempt: int, exc: Exception) -> None:
        """Sleep ``delay`` seconds, giving up (``_give_up``) as soon as ``keep_trying()`` says no."""
        loop = asyncio.get_running_loop()
        until = loop.time() + delay
        while (left := until - loop.time()) > 0:
            await asyncio.sleep(min(left, GIVE_UP_CHECK_S))
            if not self.keep_trying():
                self._give_up(what, attempt, exc)

    def _give_up(self, what: str, attempt: int, exc: Exception) -> NoReturn:
        log.warning(
            "%s failed (attempt %d): %s: %s; giving the step up (stopping or partitions revoked): "
            "its records stay unacked for the next owner",
            what,
            attempt,
            type(exc).__name__,
            exc,
        )
        # Forgotten by the lock holder that catches it (``_exclusive``), not here: a pipelined
        # flush gives up without the lock, possibly inside a poll's await.
        raise StepAbandoned(f"{what} given up after {attempt} failed attempt(s): {type(exc).__name__}: {exc}") from exc

    def _abandon(self) -> None:
        """Forget all in-memory work after a give-up (the gate's "drop everything, restart from the
        committed offsets"): a step left half done could otherwise release an effect whose cause's
        commit was given up, or take a re-read event for a pending one. Every tracked partition is
        fenced (its records are refused until it is assigned again: the revoke that made us give up
        re-assigns, and aiokafka then resumes from the committed offsets), so nothing past the last
        committed offset is ever acked. Marks and commits that landed stay: they are facts."""
        for tp in self.tracker.partitions():
            self.tracker.revoke(tp, fence=True)
        self.gate = CausalGate(self.gate.timeout_s, self.gate.max_parked)
        self.batches.take_all()
        for table in (self._handles, self._records, self._parked_at):
            table.clear()
        self._cause_seen.clear()
        self._cause_checked.clear()
        self._repaired.clear()

    # --- output ---------------------------------------------------------------------------------

    def _acks_due(self) -> list[Any]:
        out = []
        for tp, queue in self._handles.items():
            limit = self.tracker.committable(tp)
            if limit is None:
                continue
            records = self._records[tp]
            while queue and queue[0][0] < limit:
                offset, handle = queue.popleft()
                records.pop(offset, None)
                out.append(handle)
        return out

    def _export_gauges(self) -> None:
        """Parked and in-flight per world (parked + batched), with the oldest one's wall-clock time.

        Only worlds whose figures may have moved are looked at: those with parked or batched
        events now, those that had some at the last export (they go back to 0 once), and known
        worlds never exported. An idle world's gauges already say 0: with 100 worlds a tick set
        ~200 gauges (every 0.25 s) whatever the traffic."""
        now_mono, now_wall = self.clock(), time.time()
        parked: dict[str, int] = defaultdict(int)
        oldest: dict[str, float] = {}
        for (world, _), (parked_at, _tp) in self._parked_at.items():
            parked[world] += 1
            oldest[world] = min(oldest.get(world, parked_at), parked_at)
        shown = self._gauges_shown
        batches = self.batches
        busy: set[str] = set()
        for world in self._gauges_busy.union(parked, batches.worlds(), self._known_worlds - shown.keys()):
            n = parked.get(world, 0)
            count = n + batches.size(world)
            since = oldest.get(world)
            batched_since = batches.started_at(world)
            if batched_since is not None:
                # The batch's real age (not capped at the flush interval): a batch that cannot flush shows.
                since = batched_since if since is None else min(since, batched_since)
            if count:
                busy.add(world)
            state = (n, count, since)
            if shown.get(world) == state:
                continue
            shown[world] = state
            self.metrics.set_parked(world, n)
            self.metrics.inflight(world, count, now_wall - (now_mono - since) if since is not None else None)
        self._gauges_busy = busy

    def summary(self) -> dict[str, int]:
        return dict(self.totals) | {"parked": self.gate.parked_count, "in_flight": self.tracker.in_flight()}
