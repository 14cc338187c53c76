"""Intake of the change topics by batches: an aiokafka ``getmany`` loop that owns its offsets.

Why not a Faust agent: Faust's per-message path (consumer → conductor → ``mode.wait_first`` per
message → stream iteration → per-event ack) costs 61–68 µs of CPU per event, which alone caps a
worker near 15k events/s on an idle core (docs/architecture.md, "Intake by batches"). The loop here
hands a whole poll to the applier in one call. Faust still runs the worker: this loop is a service
of the Faust app (``attach``), which keeps the web server (/metrics, /health), the lifecycle, the
timers and the control-plane loops.

One step, under ``_lock`` (the same lock the rebalance listener, the tick and ``stop`` take):

1. ``getmany`` up to ``batch_max_events`` records (outside the lock, so a rebalance can run);
2. drop the poll if a rebalance ran since it returned (the *generation* moved): records fetched
   before a revoke are never processed nor acked, the new assignment re-reads them from the
   committed offsets; keep only records of partitions assigned now;
3. ``Applier.process`` (dedupe, gate, batch, flush when due);
4. commit, per assigned partition, the offset tracker's committable offset when it moved: the
   first offset not yet committed to Nessie or dead-lettered, so offsets only ever pass settled
   events, in order.

On revoke the listener flushes what is released, commits, and lets the applier drop the revoked
partitions' parked events (the next owner re-reads them). Under backpressure the partitions the
applier names are paused (``Applier.to_pause``): held back by parked events, only those read ahead
in record time, so the causes they wait for are still read; past memory's hard bound, or while
commits lag, all of them. The loop keeps polling (group membership stays alive).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Collection, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from agents.applier import Applier, RawRecord, StepAbandoned
from agents.kafka_loop import KafkaLoop
from agents.readtime import ReadTime
from monitoring.metrics import Metrics
from streams.security import kafka_client_options
from streams.settings import Settings

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25
POLL_TIMEOUT_MS = 200


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, intake: ChangeIntake) -> None:
        self._intake = intake

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._intake.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._intake.on_assigned(assigned)


class ChangeIntake(KafkaLoop):
    """The change topics' consumer (group ``app_id``) feeding one :class:`Applier`."""

    name = "change intake"
    retry_on = (KafkaError, IllegalStateError)

    def __init__(self, settings: Settings, applier: Applier, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.applier = applier
        self.metrics = metrics
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer = None
        # Bumped by every rebalance: a poll that returned in an older generation is dropped.
        self.generation = 0
        self._committed: dict[TopicPartition, int] = {}
        # Partitions the applier was told are assigned (cleared by a revoke).
        self._taken: set[TopicPartition] = set()
        # Revokes waiting for the lock or running: while > 0 (or stopping) a retry gives up.
        self._revoking = 0
        applier.keep_trying = self._keep_trying
        applier.fence = self.fence
        # Where reading stands in record time, per assigned partition (the causal timeout's
        # second clock); handed to the applier by ``start`` (a real consumer reports high watermarks).
        self.reading = ReadTime()
        self.stats = {
            "polls": 0,
            "records": 0,
            "dropped_stale": 0,
            "commits": 0,
            "commit_failures": 0,
            "fences": 0,
            "fences_refused": 0,
        }

    @property
    def topics(self) -> tuple[str, str]:
        return (self.settings.objects_topic, self.settings.links_topic)

    def assignment(self) -> set[TopicPartition]:
        consumer = self._consumer
        return set(consumer.assignment()) if consumer is not None else set()

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.settings.app_id,
            client_id=f"{self.settings.app_id}-intake",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.settings.batch_max_events,
            max_partition_fetch_bytes=max(4 * 1_048_576, self.settings.max_event_bytes * 2),
            # A trickle gathers at the broker for up to the wait instead of coming a few records a
            # poll (at 1,000 events/s: ~84 polls a second of ~12 records, each ~3.5 ms of CPU).
            fetch_max_wait_ms=self.settings.intake_fetch_wait_ms,
            fetch_min_bytes=self.settings.intake_fetch_min_bytes,
            session_timeout_ms=int(self.settings.session_timeout_s * 1000),
            heartbeat_interval_ms=int(max(1.0, self.settings.session_timeout_s / 5) * 1000),
            **kafka_client_options(self.settings),
        )
        self._consumer.subscribe(topics=list(self.topics), listener=_Rebalance(self))
        await self._consumer.start()
        self.applier.reading = self.reading
        await self.applier.dlq.start()  # type: ignore[attr-defined]
        log.info("change intake started: group %s, topics %s", self.settings.app_id, ", ".join(self.topics))

    def _keep_trying(self) -> bool:
        """The applier's retries go on unless the worker stops or a revoke waits for the lock."""
        return not self._revoking and not self._stopping.is_set()

    async def stop(self) -> None:
        """Commit what is released and ack it, then leave the group, within ``shutdown_timeout_s``.

        A step in flight retrying a failing dependency gives up at its next failure once stopping
        is set (``Applier.keep_trying``, ``StepAbandoned``), so the lock comes free within about
        ``GIVE_UP_CHECK_S`` plus one call. The timeout stays as the last resort (a call that hangs
        rather than fails): past it the clients close without the final commit. Both are safe:
        nothing uncommitted is acked, and the next owner re-reads it (dedupe and the branch's
        recorded offsets settle what did land).
        """
        self._stopping.set()
        try:
            await asyncio.wait_for(self._commit_and_close(), self.settings.shutdown_timeout_s)
        except TimeoutError:
            log.warning(
                "change intake: stopping after %.0fs without its final commit (a dependency keeps failing); "
                "the next owner re-reads the records not committed",
                self.settings.shutdown_timeout_s,
            )
            consumer, self._consumer = self._consumer, None
            if consumer is not None:
                await consumer.stop()
        # start() started the applier's dead-letter producer: this stop closes it, after the final
        # flush (which may dead-letter) or once that flush was given up.
        await self.applier.dlq.stop()  # type: ignore[attr-defined]

    async def _commit_and_close(self) -> None:
        async with self._lock:
            if self._consumer is not None:
                await self._abandonable(self.applier.flush_all(), "final flush")
                await self._commit(self.assignment())
            consumer, self._consumer = self._consumer, None
        # Closed outside the lock: aiokafka's close waits for the group's coordination task, which
        # may be running our rebalance listener, and the listener waits for this lock (a deadlock
        # until the shutdown timeout otherwise). With the consumer gone, a listener or step that
        # gets the lock now sees nothing to commit.
        if consumer is not None:
            await consumer.stop()

    async def _abandonable(self, work: Awaitable[Any], what: str) -> bool:
        """Await applier ``work``; False if it gave up (``StepAbandoned``: stopping or revoking)."""
        try:
            await work
        except StepAbandoned as exc:
            log.warning("change intake: %s given up: %s", what, exc)
            return False
        return True

    # --- the loop -------------------------------------------------------------------------------

    async def step(self) -> int:
        """One poll through the applier; returns how many records it handed over."""
        consumer = self._consumer
        if consumer is None:
            if self._stopping.is_set():
                return 0
            raise RuntimeError("ChangeIntake.start() first")
        self._apply_backpressure(consumer)
        polled = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=self.settings.batch_max_events)
        generation = self.generation  # no await between the poll's return and this read
        self.stats["polls"] += 1
        async with self._lock:
            if self._consumer is None:
                return 0  # stopped while the poll ran: nothing more is processed or acked
            self._take_assignment()
            records = self.admit(polled, generation, self._taken)
            if generation == self.generation:
                await self._note_reading(consumer, polled)
            # Adaptive batching: a poll that is not full means intake has caught up.
            full = len(records) >= self.settings.batch_max_events
            self.applier.idle = self.settings.batch_flush_when_idle and not full
            # Behind: a full poll, or a full poll's worth still on the broker past this one. An
            # empty poll of paused partitions (backpressure: commits lagging) says nothing new.
            if records or not consumer.paused():
                self.applier.behind = full or backlog(consumer, polled) >= self.settings.batch_max_events
            if records:
                # ``_abandonable`` written out: no wrapper coroutine and frame a poll on the hot path.
                try:
                    await self.applier.process(records)
                except StepAbandoned as exc:
                    log.warning("change intake: step given up: %s", exc)
            await self._commit(self.assignment())
        return len(records)

    def admit(
        self, polled: dict[TopicPartition, list[Any]], generation: int, assigned: Collection[TopicPartition]
    ) -> list[RawRecord]:
        """The records of a poll the applier may see: none if a rebalance ran since the poll
        returned (``generation`` is stale), else those of partitions assigned now."""
        if generation != self.generation:
            n = sum(len(rs) for rs in polled.values())
            self.stats["dropped_stale"] += n
            if n:
                log.info("dropped %d record(s) polled before a rebalance; they are re-read", n)
            return []
        out = [
            RawRecord(r.topic, r.partition, r.offset, r.key, r.value, r.headers or (), None)
            for tp, rs in polled.items()
            if tp in assigned
            for r in rs
        ]
        self.stats["records"] += len(out)
        return out

    async def _note_reading(self, consumer: AIOKafkaConsumer, polled: dict[TopicPartition, list[Any]]) -> None:
        """Feed ``reading`` from a poll, before its records reach the applier (an event parked
        now is read at its partition's last record time): the last record per partition, and per
        assigned partition the high watermark of its last fetch and the position aiokafka hands
        out from (past any offset with no record for us, such as a transaction marker). The
        position is asked only once a fetch reported the high watermark: aiokafka then holds a
        valid position and answers without a round trip."""
        if self.applier.reading is not self.reading:
            return
        reading = self.reading
        assigned = [tp for tp in consumer.assignment() if tp in self._taken]
        reading.assigned({(tp.topic, tp.partition) for tp in assigned})
        for tp, rs in polled.items():
            if rs and tp in self._taken:
                reading.read((tp.topic, tp.partition), rs[-1].offset, rs[-1].timestamp)
        for tp in assigned:
            mark = consumer.highwater(tp)
            position = await consumer.position(tp) if mark is not None else None
            reading.fetched((tp.topic, tp.partition), position, mark)

    async def ticks(self) -> None:
        """Periodic applier work (expiries, age flushes) and the offset commits it allows."""
        while not self._stopping.is_set():
            await asyncio.sleep(TICK_SECONDS)
            if self._consumer is None:
                continue
            async with self._lock:
                if self._consumer is None:
                    continue
                await self._abandonable(self.applier.tick(), "tick")
                await self._commit(self.assignment())

    def _apply_backpressure(self, consumer: AIOKafkaConsumer) -> None:
        """Pause what the applier's backpressure asks (``Applier.to_pause``), resume the rest."""
        assigned = {(tp.topic, tp.partition): tp for tp in consumer.assignment()}
        wanted = {assigned[tp] for tp in self.applier.to_pause(assigned)}
        paused = consumer.paused()
        fresh = [tp for tp in assigned.values() if tp in wanted and tp not in paused]
        if fresh:
            consumer.pause(*fresh)
        done = [tp for tp in paused if tp not in wanted]
        if done:
            consumer.resume(*done)

    async def _commit(self, tps: Iterable[TopicPartition]) -> None:
        """Commit the tracker's committable offset of each partition in ``tps`` that moved."""
        consumer = self._consumer
        if consumer is None:
            return
        offsets: dict[TopicPartition, int] = {}
        for tp in tps:
            offset = self.applier.tracker.committable((tp.topic, tp.partition))
            if offset is not None and offset != self._committed.get(tp):
                offsets[tp] = offset
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # The group rebalanced under us: the revoke path commits, or the next owner re-reads.
            self.stats["commit_failures"] += 1
            log.warning("change intake: offset commit failed (rebalance): %r", exc)
            return
        self._committed.update(offsets)
        self.stats["commits"] += 1

    async def fence(self, tps: Collection[tuple[str, int]]) -> bool:
        """Confirm this consumer is still a member of the group's current generation and owns
        ``tps``: commit their committable offsets (unchanged ones again) synchronously. The group
        coordinator refuses a commit from a member it removed (``UNKNOWN_MEMBER_ID``) or of an
        older generation (``ILLEGAL_GENERATION``), and one during a rebalance's sync
        (``REBALANCE_IN_PROGRESS``); aiokafka raises all three as ``CommitFailedError``. A commit it
        accepts also restarts the member's session timeout, as a heartbeat does (classic group
        coordinator, Stable and PreparingRebalance). False: the membership is lost, or is about to
        be (see ``_membership_known``). Other Kafka errors propagate (the applier retries them)."""
        consumer = self._consumer
        if consumer is None or not _membership_known(consumer):
            self.stats["fences_refused"] += 1
            return False
        offsets: dict[TopicPartition, int] = {}
        for topic, partition in tps:
            offset = self.applier.tracker.committable((topic, partition))
            if offset is None:  # not tracked: revoked, or never ours
                self.stats["fences_refused"] += 1
                return False
            offsets[TopicPartition(topic, partition)] = offset
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            self.stats["fences_refused"] += 1
            log.warning("change intake: membership fence refused: %r", exc)
            return False
        self._committed.update(offsets)
        self.stats["fences"] += 1
        return True

    # --- rebalances -----------------------------------------------------------------------------

    async def on_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        """Before partitions move: commit what is released, ack it, forget the rest.

        From before it waits for the lock until it is done, the applier's retries give up at their
        next failure (``_keep_trying``): a step stuck on a failing dependency would otherwise hold
        the lock, and the group's rebalance, for as long as the outage lasts. A step that gave up
        left the applier empty and every partition fenced; aiokafka's revoke is the whole
        assignment (eager protocol), so the assignment that follows takes them all again from the
        committed offsets.
        """
        tps = list(revoked)
        self._revoking += 1
        try:
            async with self._lock:
                self.generation += 1
                await self._abandonable(self.applier.flush_all(), "flush on revoke")
                try:
                    await self._commit(tps)
                except KafkaError as exc:
                    log.warning("change intake: commit on revoke failed: %r", exc)
                await self._abandonable(self.applier.revoke([(tp.topic, tp.partition) for tp in tps]), "revoke")
                for tp in tps:
                    self._taken.discard(tp)
                    self._committed.pop(tp, None)
                self.reading.assigned({(tp.topic, tp.partition) for tp in self._taken})
        finally:
            self._revoking -= 1

    async def on_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        """A new assignment. No generation bump here: aiokafka may hand out records of the new
        assignment before this callback runs, and dropping them would skip offsets (the position is
        already past them). Only records returned before the revoke are stale."""
        async with self._lock:
            self._take_assignment()
        log.info("change intake assigned %d partition(s)", len(list(assigned)))

    def _take_assignment(self) -> None:
        """Tell the applier about partitions assigned since the last revoke, before any of their
        records reach it (under ``_lock``; the step calls it too, in case its poll came first)."""
        new = self.assignment() - self._taken
        if new:
            self._taken |= new
            self.applier.on_assigned(sorted((tp.topic, tp.partition) for tp in new))


def backlog(consumer: Any, polled: dict[TopicPartition, list[Any]]) -> int:
    """Records the broker held past this poll on its partitions, by the high watermarks the fetches
    reported (``AIOKafkaConsumer.highwater``; unknown counts as none)."""
    highwater = getattr(consumer, "highwater", None)
    if highwater is None:
        return 0
    left = 0
    for tp, records in polled.items():
        mark = highwater(tp) if records else None
        if mark is not None:
            left += max(0, mark - (records[-1].offset + 1))
    return left


def _membership_known(consumer: AIOKafkaConsumer) -> bool:
    """False when aiokafka already knows the membership is gone or going: its generation was reset
    (a heartbeat or commit met ``UNKNOWN_MEMBER_ID``/``ILLEGAL_GENERATION``; a commit then goes
    out as generation -1, which the coordinator accepts whenever the group is empty) or a rejoin
    is pending (a heartbeat met ``REBALANCE_IN_PROGRESS``: the coordinator still takes commits
    of this generation, but evicts the member at the rebalance timeout if it has not rejoined).
    When aiokafka cannot say (see ``group_membership``), only the commit decides."""
    return group_membership(consumer) is not False


#: The aiokafka internals ``group_membership`` reads. aiokafka has no public API for the group
#: generation or a pending rejoin (0.14.0: ``AIOKafkaConsumer`` exposes neither, its rebalance
#: listener reports partitions only). Assumed as of 0.14.0 (pyproject asks >=0.14.0) and checked
#: against the installed package by ``tests/unit/test_agents_intake.py`` and, on a
#: joined consumer, by ``tests/integration/test_membership_fence.py``: an upgrade that moves them
#: fails those tests.
AIOKAFKA_MEMBERSHIP = "consumer._coordinator.generation, .need_rejoin(consumer._subscription.subscription)"


def group_membership(consumer: AIOKafkaConsumer) -> bool | None:
    """The only reader of aiokafka's private group state. True: a member of its current
    generation, no rejoin pending; False: aiokafka knows the membership is gone or going; None:
    not known (not started, or no group coordinator yet), or aiokafka's internals are not what
    ``AIOKAFKA_MEMBERSHIP`` says (logged once as an error): the fence then falls back to its
    commit, which the coordinator refuses from a member it no longer has."""
    coordinator = getattr(consumer, "_coordinator", None)
    subscription = getattr(getattr(consumer, "_subscription", None), "subscription", None)
    if coordinator is None or subscription is None:
        return None
    generation = getattr(coordinator, "generation", None)
    need_rejoin = getattr(coordinator, "need_rejoin", None)
    if not isinstance(generation, int) or not callable(need_rejoin):
        _report_unreadable_membership(type(coordinator).__name__)
        return None
    if generation < 0:
        return False
    return not need_rejoin(subscription)


@functools.cache
def _report_unreadable_membership(coordinator_type: str) -> None:
    """Once per process: a fence weaker than intended must be seen, not crash the worker."""
    log.error(
        "aiokafka's group state is not where %s says (coordinator %s): the membership fence "
        "relies on its offset commit alone",
        AIOKAFKA_MEMBERSHIP,
        coordinator_type,
    )


def attach(app: Any, intake: ChangeIntake) -> ChangeIntake:
    """Run the intake inside a Faust worker: started after the app starts, stopped with it.

    An unexpected error in the loop crashes the app (the worker exits) rather than leaving a live
    worker that reads nothing.
    """
    from mode import Service

    class ChangeIntakeService(Service):
        async def on_start(self) -> None:
            await intake.start()
            self.add_future(self._guard(intake.run()))
            self.add_future(self._guard(intake.ticks()))

        async def _guard(self, coro: Any) -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                log.exception("change intake failed; stopping the worker")
                await self.crash(exc)

        async def on_stop(self) -> None:
            await intake.stop()

    app.add_dependency(ChangeIntakeService())
    return intake
