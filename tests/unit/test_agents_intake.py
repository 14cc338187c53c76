"""The change intake's offset and rebalance rules, with a scripted consumer and the real applier.

What the fake consumer models of aiokafka: ``getmany`` hands out records drained from its buffer,
``commit`` stores offsets for assigned partitions only, and a rebalance calls the listener's
``on_partitions_revoked`` before the assignment changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from agents.intake import ChangeIntake
from streams.settings import Settings
from tests.fakes import FakeCommitter, FakeMarks, HeldMarks, NessieDown, applier_with, event, make

TOPIC = "onto.changes.objects"
P0, P1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


def record(tp: TopicPartition, offset: int, value: bytes, key: bytes | None = None) -> ConsumerRecord:
    if key is None:
        doc = orjson.loads(value)
        key = f"{doc['world_id']}::{doc['object_pk']}".encode()
    return ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, key, value, None, len(key), len(value), ())


class FakeConsumer:
    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = set(assigned)
        self.polls: list[dict[TopicPartition, list[ConsumerRecord]]] = []
        self.commits: list[dict[TopicPartition, int]] = []
        self._paused: set[TopicPartition] = set()
        self.on_poll: Callable[[], Any] | None = None

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        await asyncio.sleep(0)
        if not self.polls:
            return {}
        poll = self.polls.pop(0)
        held = {tp: rs for tp, rs in poll.items() if tp in self._paused}
        if held:  # a paused partition's records come again after resume
            self.polls.insert(0, held)
        return {tp: rs for tp, rs in poll.items() if tp not in self._paused}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        assert set(offsets) <= self.assigned, "aiokafka refuses to commit unassigned partitions"
        self.commits.append(dict(offsets))

    def pause(self, *tps: TopicPartition) -> None:
        self._paused |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._paused -= set(tps)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    async def stop(self) -> None:
        pass


def intake_with(consumer: FakeConsumer) -> tuple[ChangeIntake, Any, Any]:
    applier, committer, dlq, _ = make()
    intake = ChangeIntake(applier.settings, applier)
    intake._consumer = consumer  # type: ignore[assignment]
    return intake, committer, dlq


def committed_ids(committer: Any) -> list[str]:
    return [e.event_id for b in committer.batches for e in b.events]


async def test_commits_only_the_settled_prefix_then_moves_on_when_the_wait_ends() -> None:
    consumer = FakeConsumer({P0})
    intake, committer, _ = intake_with(consumer)
    consumer.polls.append(
        {P0: [record(P0, 0, event(0)), record(P0, 1, event(1)), record(P0, 2, event(2, caused_by="e9"))]}
    )
    consumer.polls.append({P0: [record(P0, 3, event(3)), record(P0, 4, event(9))]})
    await intake.step()
    # e2 waits for e9: offset 2 holds the partition back although nothing later is unsettled.
    assert committed_ids(committer) == ["e0", "e1"]
    assert consumer.commits == [{P0: 2}]
    await intake.step()
    await intake.applier.tick()
    await intake._commit(consumer.assignment())
    assert set(committed_ids(committer)) == {"e0", "e1", "e2", "e3", "e9"}
    assert [c[P0] for c in consumer.commits] == [2, 5]


async def test_a_poll_returned_before_a_revoke_is_never_processed_nor_acked() -> None:
    consumer = FakeConsumer({P0})
    intake, committer, dlq = intake_with(consumer)
    consumer.polls.append({P0: [record(P0, 0, event(0)), record(P0, 1, b"{bad", key=b"prod::x")]})
    # A tick holds the lock; the rebalance's revoke queues for it, then the poll returns.
    await intake._lock.acquire()
    revoke = asyncio.create_task(intake.on_revoked([P0]))
    await asyncio.sleep(0)
    step = asyncio.create_task(intake.step())
    for _ in range(5):
        await asyncio.sleep(0)
    intake._lock.release()
    await revoke
    assert await step == 0
    assert committer.batches == [] and dlq.letters == [] and consumer.commits == []
    # The fake consumer keeps P0 assigned, so the tracker takes it again (fresh, nothing consumed).
    assert intake.applier.totals["consumed"] == 0 and intake.applier.tracker.in_flight() == 0
    assert intake.stats["dropped_stale"] == 2


async def test_a_poll_of_the_new_assignment_before_the_assigned_callback_is_kept() -> None:
    # aiokafka may hand out records of the new assignment before on_partitions_assigned runs;
    # dropping them would skip offsets (the consumer's position is already past them).
    consumer = FakeConsumer({P0})
    intake, committer, _ = intake_with(consumer)
    calls: list[object] = []
    applier = intake.applier
    on_assigned, process = applier.on_assigned, applier.process
    applier.on_assigned = lambda tps=None: (calls.append(("assigned", tps)), on_assigned(tps))[1]  # type: ignore[method-assign]

    async def spy_process(records: Any) -> Any:
        calls.append(("process", len(records)))
        return await process(records)

    applier.process = spy_process  # type: ignore[method-assign]
    await intake.on_revoked([P0])
    consumer.polls.append({P0: [record(P0, 0, event(0))]})
    assert await intake.step() == 1
    await intake.on_assigned([P0])
    assert committed_ids(committer) == ["e0"]
    assert consumer.commits == [{P0: 1}]
    # The applier learns of the assignment before it sees the partition's records, and once.
    assert calls == [("assigned", [(TOPIC, 0)]), ("process", 1)]


async def test_records_of_partitions_not_assigned_never_reach_the_applier() -> None:
    consumer = FakeConsumer({P0})
    intake, committer, _ = intake_with(consumer)
    consumer.polls.append({P0: [record(P0, 0, event(0))], P1: [record(P1, 0, event(1))]})
    assert await intake.step() == 1
    assert committed_ids(committer) == ["e0"]
    assert intake.applier.tracker.partitions() == [(TOPIC, 0)]


async def test_revoke_commits_released_events_and_leaves_the_parked_offset_to_the_next_owner() -> None:
    consumer = FakeConsumer({P0, P1})
    intake, committer, _ = intake_with(consumer)
    intake.applier.batches.max_seconds = 60.0  # nothing flushes on its own
    intake.settings = intake.settings.replace(batch_flush_when_idle=False)
    consumer.polls.append(
        {P0: [record(P0, 0, event(0)), record(P0, 1, event(1, caused_by="e9")), record(P0, 2, event(2))]}
    )
    await intake.step()
    assert committer.batches == [] and all(c[P0] == 0 for c in consumer.commits)
    await intake.on_revoked([P0, P1])
    assert committed_ids(committer) == ["e0", "e2"]
    assert consumer.commits[-1] == {P0: 1}  # e1 is parked: the next owner re-reads from it
    assert intake.applier.tracker.partitions() == []


async def test_a_full_gate_pauses_intake_and_resumes_when_it_drains() -> None:
    consumer = FakeConsumer({P0})
    intake, _, _ = intake_with(consumer)
    applier = intake.applier
    applier.gate.max_parked = 1
    consumer.polls.append({P0: [record(P0, 0, event(0, caused_by="e9"))]})
    await intake.step()
    assert applier.backpressure
    consumer.polls.append({P0: [record(P0, 1, event(9))]})
    await intake.step()  # paused: the cause is not read yet
    assert consumer.paused() == {P0} and applier.tracker.in_flight() == 1
    applier.gate.max_parked = 10
    await intake.step()
    assert consumer.paused() == set()
    assert applier.tracker.in_flight() == 0 and consumer.commits[-1] == {P0: 2}


async def test_a_stop_while_a_step_retries_a_failing_dependency_ends_within_the_shutdown_timeout() -> None:
    """SIGTERM must end a worker whose step is stuck retrying (a dependency down): the stop gives up
    its final commit after ``shutdown_timeout_s``, closes the consumer and acks nothing more."""
    consumer = FakeConsumer({P0})
    closed: list[bool] = []

    async def stop_consumer() -> None:
        closed.append(True)

    consumer.stop = stop_consumer  # type: ignore[method-assign]
    intake, committer, _ = intake_with(consumer)
    intake.settings = intake.settings.replace(shutdown_timeout_s=0.2)
    stuck = asyncio.Event()

    async def process_forever(records: object) -> None:
        stuck.set()
        await asyncio.Event().wait()  # like Applier._retry against a service that never recovers

    intake.applier.process = process_forever  # type: ignore[method-assign]
    consumer.polls.append({P0: [record(P0, 0, event(0))]})
    step = asyncio.create_task(intake.step())
    await asyncio.wait_for(stuck.wait(), 5)
    commits_before = list(consumer.commits)
    await asyncio.wait_for(intake.stop(), 5)  # hung here before: stop waited for the step's lock
    assert closed == [True] and consumer.commits == commits_before and committer.batches == []
    step.cancel()


def intake_with_nessie_down(consumer: FakeConsumer, pipelined: bool) -> tuple[ChangeIntake, NessieDown, FakeMarks]:
    settings = Settings.from_env({}).replace(batch_max_events=100, batch_max_seconds=0.0, shutdown_timeout_s=60.0)
    committer, marks = NessieDown(), FakeMarks()
    intake = ChangeIntake(settings, applier_with(settings, committer, marks, pipelined=pipelined))
    intake._consumer = consumer  # type: ignore[assignment]
    return intake, committer, marks


@pytest.mark.parametrize("pipelined", [False, True], ids=["inline", "pipelined"])
async def test_a_step_retrying_a_failing_commit_gives_up_when_its_partitions_are_revoked(pipelined: bool) -> None:
    """Before: the step (or the background flush holding the applier's lock) retried the commit for
    as long as Nessie was down, and the revoke waited for the lock just as long. Now the retry gives
    up at its next failure: the lock comes free, nothing is acked or marked, and the applier keeps
    nothing of the abandoned work (the re-read after the assignment is committed, not taken for a
    copy of an event still pending)."""
    consumer = FakeConsumer({P0})
    intake, committer, marks = intake_with_nessie_down(consumer, pipelined)
    consumer.polls.append({P0: [record(P0, 0, event(0)), record(P0, 1, event(1, caused_by="e0"))]})
    step = asyncio.create_task(intake.step())
    await asyncio.wait_for(committer.failing.wait(), 5)
    await asyncio.wait_for(intake.on_revoked([P0]), 5)  # hung here before: the lock was never free
    assert await asyncio.wait_for(step, 5) == 2
    assert not intake._lock.locked() and not intake.applier.lock.locked()
    # Nothing acked past the first record (pipelined, the step itself committed offset 0: nothing).
    assert all(c[P0] == 0 for c in consumer.commits) and marks.marked == set() and committer.batches == []
    assert intake.applier.tracker.in_flight() == 0 and intake.applier.tracker.committable((TOPIC, 0)) is None
    # The next assignment re-reads from the committed offset (none yet: 0) with Nessie back.
    committer.down = False
    await intake.on_assigned([P0])
    consumer.polls.append({P0: [record(P0, 0, event(0)), record(P0, 1, event(1, caused_by="e0"))]})
    await intake.step()
    await intake.applier.flush_all()
    await intake._commit(consumer.assignment())
    assert committed_ids(committer.inner) == ["e0", "e1"]
    assert consumer.commits[-1] == {P0: 2} and marks.marked == {("prod", "e0"), ("prod", "e1")}


async def test_a_stop_while_a_step_retries_a_failing_commit_gives_the_step_up_long_before_the_timeout() -> None:
    consumer = FakeConsumer({P0})
    intake, committer, marks = intake_with_nessie_down(consumer, pipelined=False)
    consumer.polls.append({P0: [record(P0, 0, event(0)), record(P0, 1, event(1))]})
    step = asyncio.create_task(intake.step())
    await asyncio.wait_for(committer.failing.wait(), 5)
    # shutdown_timeout_s is 60: a stop that returns within 5 s did not wait for the last resort.
    await asyncio.wait_for(intake.stop(), 5)
    assert await asyncio.wait_for(step, 5) == 2
    assert not intake._lock.locked() and not intake.applier.lock.locked()
    assert consumer.commits == [] and marks.marked == set() and committer.batches == []
    assert intake.applier.tracker.in_flight() == 0


async def test_the_membership_fence_recommits_the_committable_offset_and_a_refused_commit_refuses_it() -> None:
    """The intake's fence before an expiry: a commit of the partition's committable offset (the
    parked one, committed again); aiokafka's CommitFailedError (the coordinator no longer knows
    the member) is a refusal, so the expiring event is forgotten, not dead-lettered."""
    from aiokafka.errors import CommitFailedError

    consumer = FakeConsumer({P0})
    intake, _, dlq = intake_with(consumer)
    now = [100.0]
    intake.applier.clock = lambda: now[0]
    consumer.polls.append({P0: [record(P0, 0, event(0)), record(P0, 1, event(1, caused_by="e9"))]})
    await intake.step()
    assert consumer.commits == [{P0: 1}]
    assert await intake.fence([(TOPIC, 0)]) and consumer.commits[-1] == {P0: 1}

    async def refused(offsets: dict[TopicPartition, int]) -> None:
        raise CommitFailedError("the group has already rebalanced")

    consumer.commit = refused  # type: ignore[method-assign]
    now[0] += intake.applier.settings.causal_timeout_s + 1
    await intake.applier.tick()
    assert dlq.letters == [] and intake.stats["fences_refused"] == 1
    assert intake.applier.tracker.committable((TOPIC, 0)) is None


async def test_a_revoke_while_a_commit_settles_without_the_lock_commits_its_offsets_after_its_marks() -> None:
    """A pipelined flush settles without the applier's lock; a revoke that comes while it waits in
    its marks waits for it (the scheduler's drain), then commits the settled offsets (the marks are
    written by then) and forgets the partition; the parked event is left to the next owner."""
    consumer = FakeConsumer({P0})
    settings = Settings.from_env({}).replace(batch_max_events=2, batch_max_seconds=60.0, batch_flush_when_idle=False)
    committer, marks = FakeCommitter(), HeldMarks()
    applier = applier_with(settings, committer, marks, pipelined=True)
    intake = ChangeIntake(settings, applier)
    intake._consumer = consumer  # type: ignore[assignment]
    marks.writes_open.clear()
    consumer.polls.append(
        {P0: [record(P0, 0, event(0)), record(P0, 1, event(1)), record(P0, 2, event(2, caused_by="e9"))]}
    )
    await intake.step()  # e0, e1 due: committed in the background, then held in their marks
    for _ in range(20):
        await asyncio.sleep(0)
    assert committed_ids(committer) == ["e0", "e1"] and marks.waiting == ["write"]
    marked_at_commit: list[set[tuple[str, str]]] = []
    commit = consumer.commit

    async def recording(offsets: dict[TopicPartition, int]) -> None:
        marked_at_commit.append(set(marks.marked))
        await commit(offsets)

    consumer.commit = recording  # type: ignore[method-assign]
    revoke = asyncio.create_task(intake.on_revoked([P0]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not revoke.done()  # waits for the settle
    marks.writes_open.set()
    await asyncio.wait_for(revoke, 5)
    assert consumer.commits[-1] == {P0: 2}  # e0, e1 settled; e2 parked: re-read from 2
    assert marked_at_commit[-1] == {("prod", "e0"), ("prod", "e1")}
    assert intake.applier.tracker.partitions() == [] and committed_ids(committer) == ["e0", "e1"]


async def test_aiokafkas_own_coordinator_answers_where_the_membership_fence_reads_it() -> None:
    """A consumer subscribed but not joined: aiokafka says a rejoin is needed (False, not None:
    the state was found); a reset generation (what UNKNOWN_MEMBER_ID leaves) is False too.
    aiokafka has no public API for it; an upgrade that moves ``AIOKAFKA_MEMBERSHIP`` fails here."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.consumer.group_coordinator import GroupCoordinator

    from agents.intake import AIOKAFKA_MEMBERSHIP, group_membership

    consumer = AIOKafkaConsumer(group_id="g", bootstrap_servers="127.0.0.1:9")  # never started
    consumer.subscribe(["t"])
    coordinator = GroupCoordinator(consumer._client, consumer._subscription, group_id="g")  # noqa: SLF001
    try:
        consumer._coordinator = coordinator  # noqa: SLF001 - what start() does
        assert group_membership(consumer) is False, f"aiokafka's internals moved: {AIOKAFKA_MEMBERSHIP}"
        coordinator.generation = 4
        coordinator.reset_generation()
        assert coordinator.generation < 0 and group_membership(consumer) is False
    finally:
        await coordinator.close()
        await consumer._client.close()  # noqa: SLF001


async def test_a_consumer_not_started_has_no_known_membership() -> None:
    from aiokafka import AIOKafkaConsumer

    from agents.intake import group_membership

    consumer = AIOKafkaConsumer(group_id="g", bootstrap_servers="127.0.0.1:9")
    try:
        assert group_membership(consumer) is None
    finally:
        await consumer._client.close()  # noqa: SLF001


async def test_aiokafka_internals_that_moved_log_an_error_and_the_fence_falls_back_to_its_commit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A coordinator without ``generation``/``need_rejoin`` (an aiokafka that moved them): the
    fence neither crashes nor refuses every expiry; the coordinator's answer to the commit decides."""
    import logging
    from types import SimpleNamespace

    from aiokafka.errors import CommitFailedError

    from agents import intake as intake_module
    from agents.intake import AIOKAFKA_MEMBERSHIP, group_membership

    consumer = FakeConsumer({P0})
    consumer._coordinator = SimpleNamespace(member_id="m")  # type: ignore[attr-defined]  # noqa: SLF001
    consumer._subscription = SimpleNamespace(subscription=SimpleNamespace(topics={"t"}))  # type: ignore[attr-defined]  # noqa: SLF001
    intake, _, _ = intake_with(consumer)
    consumer.polls.append({P0: [record(P0, 0, event(0))]})
    await intake.step()
    intake_module._report_unreadable_membership.cache_clear()  # noqa: SLF001
    with caplog.at_level(logging.ERROR, logger="agents.intake"):
        assert group_membership(consumer) is None
        assert await intake.fence([(P0.topic, 0)])
    assert [r.levelno for r in caplog.records] == [logging.ERROR] and AIOKAFKA_MEMBERSHIP in caplog.text

    async def refused(offsets: dict[TopicPartition, int]) -> None:
        raise CommitFailedError("the group has already rebalanced")

    consumer.commit = refused  # type: ignore[method-assign]
    assert not await intake.fence([(P0.topic, 0)])
    assert [r.levelno for r in caplog.records].count(logging.ERROR) == 1  # once per process, not per fence


async def test_a_full_poll_tells_the_applier_the_intake_is_behind_and_a_short_one_that_it_caught_up() -> None:
    consumer = FakeConsumer({P0})
    intake, _, _ = intake_with(consumer)
    intake.settings = intake.settings.replace(batch_max_events=2)
    consumer.polls.append({P0: [record(P0, 0, event(0)), record(P0, 1, event(1))]})
    consumer.polls.append({P0: [record(P0, 2, event(2))]})
    await intake.step()
    assert intake.applier.behind and not intake.applier.idle
    await intake.step()
    assert not intake.applier.behind and intake.applier.idle


async def test_a_short_poll_with_a_full_polls_worth_left_on_the_broker_is_behind_too() -> None:
    """Polls under load are rarely full (records arrive while the last one is processed), yet the
    broker may hold seconds of records: the high watermark says so."""
    consumer = FakeConsumer({P0})
    intake, _, _ = intake_with(consumer)
    intake.settings = intake.settings.replace(batch_max_events=3)
    marks = {P0: 10}
    consumer.highwater = marks.get  # type: ignore[attr-defined]
    consumer.polls.append({P0: [record(P0, 0, event(0))]})  # offsets 1-9 still on the broker
    await intake.step()
    assert intake.applier.behind
    marks[P0] = 3
    consumer.polls.append({P0: [record(P0, 1, event(1))]})  # one left: caught up
    await intake.step()
    assert not intake.applier.behind


async def test_an_empty_poll_of_paused_partitions_leaves_the_intake_behind() -> None:
    """Backpressure pauses the partitions while commits lag: the empty polls that follow are not a
    caught-up intake (seen: cause lookups ran during a preload's pauses)."""
    consumer = FakeConsumer({P0})
    intake, _, _ = intake_with(consumer)
    intake.settings = intake.settings.replace(batch_max_events=2)
    intake.applier.gate.max_parked = 1  # one parked effect fills the gate: backpressure
    consumer.polls.append({P0: [record(P0, 0, event(0, caused_by="e9")), record(P0, 1, event(1))]})
    await intake.step()
    assert intake.applier.behind
    await intake.step()
    assert consumer.paused() == {P0} and intake.applier.behind


class MarkedConsumer(FakeConsumer):
    """Reports high watermarks and positions as aiokafka does after a fetch."""

    def __init__(self, assigned: set[TopicPartition], highwater: dict[TopicPartition, int]) -> None:
        super().__init__(assigned)
        self.marks = highwater
        self.positions: dict[TopicPartition, int] = {tp: 0 for tp in assigned}

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        polled = await super().getmany(timeout_ms, max_records)
        for tp, rs in polled.items():
            self.positions[tp] = rs[-1].offset + 1
        return polled

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.marks.get(tp)

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]


async def test_each_poll_tells_the_applier_how_far_every_partition_is_read_in_record_time() -> None:
    consumer = MarkedConsumer({P0, P1}, {P0: 50, P1: 0})
    intake, _, _ = intake_with(consumer)
    intake.applier.reading = intake.reading  # what start() does
    stamped = dataclasses.replace(record(P0, 0, event(0)), timestamp=1_234_000)
    consumer.polls.append({P0: [stamped]})
    await intake.step()
    assert intake.reading.at((TOPIC, 0)) == 1_234.0
    assert intake.reading.watermark(9_999.0) == 1_234.0  # P0 has 49 unread; P1 is empty: read to its end
    consumer.marks[P0] = 1
    await intake.step()
    assert intake.reading.watermark(9_999.0) == 9_999.0
    await intake.on_revoked([P0, P1])
    assert intake.reading.watermark(9_999.0) == 9_999.0 and intake.reading.at((TOPIC, 0)) == float("-inf")


async def test_held_back_by_parked_effects_the_partition_behind_is_still_read_and_releases_them() -> None:
    """The soak's stall (2026-12-02): effects parked on P0, read minutes ahead of P1 in record
    time, held every later P0 record for its ack; at ``max_unacked_records`` every partition was
    paused, P1 too, which holds their cause: nothing released until the timeout dead-lettered them.
    Now only P0 (ahead) pauses. Failed before: P1 paused, e0 never committed."""
    consumer = MarkedConsumer({P0, P1}, {P0: 50, P1: 50})
    intake, committer, _ = intake_with(consumer)
    applier = intake.applier
    applier.reading = intake.reading  # what start() does
    applier.settings = applier.settings.replace(max_unacked_records=2)

    def at(tp: TopicPartition, offset: int, value: bytes, seconds: float) -> ConsumerRecord:
        return dataclasses.replace(record(tp, offset, value), timestamp=int(seconds * 1000))

    ahead = [at(P0, 0, event(0, caused_by="e9"), 1_000), at(P0, 1, event(1), 1_000), at(P0, 2, event(2), 1_000)]
    consumer.polls.append({P0: ahead, P1: [at(P1, 0, event(5), 500)]})
    await intake.step()
    assert applier.backpressure and "e0" not in committed_ids(committer)
    consumer.polls.append({P0: [at(P0, 3, event(3), 1_001)], P1: [at(P1, 1, event(9), 600)]})
    await intake.step()
    assert consumer.paused() == {P0}  # P0 is 500 s ahead of P1 in record time
    assert {"e0", "e9"} <= set(committed_ids(committer))
    await intake.step()  # released: nothing held back any more, P0 resumes
    assert consumer.paused() == set() and "e3" in committed_ids(committer)
