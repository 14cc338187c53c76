"""A timed dead letter is fenced by group membership, with the real Kafka group coordinator.

Issue 12, the zombie dead letter: in a randomized kill -9 run a worker whose membership was already
gone (its session expired; it had not noticed) dead-lettered a parked event as ``cause-missing`` on
its causal timeout, while the partition's new owner applied the same event once its cause arrived.
Here the zombie is made for real: worker A's heartbeats are held (aiokafka's heartbeat call never
returns), so the broker expires A's session and hands the partition to worker B; A's state still
says it owns it. Nessie, Redis and the DLQ are stand-ins: only the group is under test.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from agents.intake import AIOKAFKA_MEMBERSHIP, ChangeIntake, group_membership
from streams.settings import Settings
from tests.fakes import FakeCommitter, event
from tests.integration.intake_fixtures import intake, one_partition_group, until

pytestmark = pytest.mark.integration


def hold_heartbeats(worker: ChangeIntake, released: asyncio.Event) -> None:
    """From now on ``worker``'s heartbeat call (aiokafka's, on its private coordinator) returns
    only once ``released`` is set: the broker stops hearing from it, and it notices nothing."""

    async def no_heartbeat() -> bool:
        await released.wait()
        return False

    worker._consumer._coordinator._do_heartbeat = no_heartbeat  # type: ignore[union-attr]  # noqa: SLF001


async def start_until_committable(worker: ChangeIntake, tp: tuple[str, int]) -> None:
    """Start ``worker`` and step it until it joined the group and holds an offset of ``tp``."""
    await worker.start()
    for _ in range(300):
        await worker.step()
        if worker.applier.tracker.committable(tp) is not None:
            return


async def test_a_zombie_whose_session_expired_does_not_dead_letter_an_event_the_new_owner_applies(
    settings: Settings, unique: str
) -> None:
    """A parks e0 (its cause e9 has not arrived); A's heartbeats stop; B joins and, once the
    broker has evicted A, owns the partition and parks e0 too. A's causal timeout then comes due.
    Before, A published e0's ``cause-missing`` letter although B applies e0 when e9 arrives. Now A's
    fence (an offset commit) is refused by the coordinator (unknown member): A publishes nothing
    and forgets the partition; B applies e9 then e0, and e0 ends applied only."""
    base = await one_partition_group(settings, "zombie", unique, events=0)
    base = base.replace(session_timeout_s=6.0)  # the broker's smallest (group.min.session.timeout.ms)
    producer = AIOKafkaProducer(bootstrap_servers=base.kafka_bootstrap)
    await producer.start()
    a_commits, b_commits = FakeCommitter(), FakeCommitter()
    a = intake(base.replace(causal_timeout_s=2.0), a_commits)
    b = intake(base.replace(causal_timeout_s=300.0), b_commits)
    held = asyncio.Event()
    runs: list[asyncio.Task[None]] = []
    try:
        await producer.send_and_wait(base.objects_topic, event(0, caused_by="e9"), key=b"prod::p0", partition=0)
        await a.start()
        for _ in range(300):
            await a.step()
            if a.applier.gate.parked_count:
                break
        assert a.applier.gate.is_parked(("prod", "e0"))

        generation = a.generation  # bumped by each revoke listener call (the first join's included)
        hold_heartbeats(a, held)  # A turns into a zombie
        await b.start()
        runs.append(asyncio.create_task(b.run()))
        await until(lambda: b.applier.gate.is_parked(("prod", "e0")), 60)  # B owns the partition now
        assert a.generation == generation, "A noticed nothing: its revoke listener never ran"

        async with a._lock:  # noqa: SLF001 - one tick of A's, as its tick loop would run it
            await a.applier.tick()
        assert a.applier.dlq.letters == [], "the zombie dead-lettered an event its partition's new owner holds"  # type: ignore[attr-defined]
        assert a.stats["fences_refused"] == 1 and a.applier.gate.parked_count == 0
        assert a.applier.tracker.committable((base.objects_topic, 0)) is None

        await producer.send_and_wait(base.objects_topic, event(9), key=b"prod::p9", partition=0)
        await until(lambda: [e.event_id for bt in b_commits.batches for e in bt.events] == ["e9", "e0"], 60)
        assert b.applier.dlq.letters == [] and a_commits.batches == []  # type: ignore[attr-defined]
    finally:
        held.set()
        await producer.stop()
        for worker in (a, b):
            await asyncio.wait_for(worker.stop(), 60)
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)


async def test_a_successful_fence_restarts_the_members_session_like_a_heartbeat(
    settings: Settings, unique: str
) -> None:
    """What makes publishing right after a fence safe for a session timeout: the coordinator takes
    an accepted offset commit as a sign of life (classic coordinator, Stable group). A's heartbeats
    are held; fences every 2 s keep it a member for 14 s, more than twice its 6 s session, and the
    fence is refused only once they stop for longer than the session."""
    s = (await one_partition_group(settings, "fence-session", unique, events=1)).replace(session_timeout_s=6.0)
    a = intake(s, FakeCommitter())
    held = asyncio.Event()
    tp = (s.objects_topic, 0)
    try:
        await start_until_committable(a, tp)
        hold_heartbeats(a, held)
        for _ in range(7):
            await asyncio.sleep(2.0)
            assert await a.fence([tp]), "a member that fences every 2 s lost its 6 s session"
        await asyncio.sleep(9.0)
        assert not await a.fence([tp])
    finally:
        held.set()
        await asyncio.wait_for(a.stop(), 60)


async def test_a_joined_members_group_state_is_read_from_aiokafka_where_the_fence_expects_it(
    settings: Settings, unique: str
) -> None:
    """The fence's pinned assumption on a real, joined consumer: aiokafka's private coordinator
    says "member, no rejoin pending" (True, not None: found where ``AIOKAFKA_MEMBERSHIP`` says),
    and a reset generation (what ``UNKNOWN_MEMBER_ID`` leaves) says False, so the fence refuses
    without a commit."""
    s = await one_partition_group(settings, "fence-state", unique, events=1)
    a = intake(s, FakeCommitter())
    tp = (s.objects_topic, 0)
    try:
        await start_until_committable(a, tp)
        assert group_membership(a._consumer) is True, f"aiokafka's internals moved: {AIOKAFKA_MEMBERSHIP}"  # noqa: SLF001
        a._consumer._coordinator.reset_generation()  # type: ignore[union-attr]  # noqa: SLF001
        assert group_membership(a._consumer) is False  # noqa: SLF001
        assert not await a.fence([tp]) and a.stats["fences"] == 0
    finally:
        await asyncio.wait_for(a.stop(), 60)
