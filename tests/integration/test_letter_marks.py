"""Dead-letter decisions per origin against the real Redis, Kafka (the DLQ topic) and Nessie.

A "crash" is a new ``Applier`` with new Redis and Kafka clients on the same branch, Redis keys and
DLQ topic, the Kafka offsets of the change topics never committed: what the first worker decided
must reach the second only through the services.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from agents.applier import Applier, RawRecord
from agents.deadletter_publisher import DeadLetterPublisher
from agents.letter_marks import CONFIRMED, dead_key, pending
from agents.marks import AppliedMarks, DeadLetterMarks
from monitoring.metrics import Metrics
from ops.redrive.plan import DlqFilter
from ops.redrive.run import read_dlq
from sinks.committer import BatchCommitter
from sinks.readback import read_world
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.integration.applier_setup import Clock, Worlds
from tests.integration.applier_setup import rec as obj_rec

pytestmark = pytest.mark.integration


@pytest.fixture
async def dl_settings(eo_settings: Settings, unique: str) -> AsyncIterator[Settings]:
    # Topics of their own: dead-letter keys name the origin, which must not be another test's.
    s = eo_settings.replace(dlq_topic=f"dlq-once-{unique}", objects_topic=f"objects-once-{unique}")
    await ensure_topics(s)
    yield s


class Worker:
    """One applier process: its own Redis connections and DLQ producer."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.marks = AppliedMarks.from_url(settings.redis_url, 300)
        self.dead = DeadLetterMarks.from_url(settings.redis_url, 300)
        self.dlq = DeadLetterPublisher(settings.kafka_bootstrap, settings.dlq_topic)
        self.applier = Applier(
            settings,
            marks=self.marks,
            committer=BatchCommitter(settings),
            dead_letters=self.dlq,
            worlds=Worlds(),
            metrics=Metrics(),
            clock=clock,
            dead_marks=self.dead,
        )

    async def close(self) -> None:
        await self.dlq.stop()
        await self.marks.close()
        await self.dead.close()


def rec(settings: Settings, *args: Any, **kw: Any) -> RawRecord:
    return replace(obj_rec(*args, **kw), topic=settings.objects_topic)


async def letters(settings: Settings) -> list[tuple[int, str]]:
    """(source offset, reason) of every DLQ record, read with the operator tools' reader."""
    records, scanned = await read_dlq(settings, DlqFilter())
    assert scanned == len(records) + sum(len(r.copies) for r in records)
    return sorted((r.letter.offset, r.letter.reason) for r in records for _ in range(1 + len(r.copies)))


async def test_dead_lettered_events_redelivered_after_a_crash_keep_their_one_letter(
    world: str,
    dl_settings: Settings,
) -> None:
    """stale-version and cause-missing letters, then a crash before the offset commit: the second
    worker settles both redelivered records (the cause has landed meanwhile) without a second
    letter, and neither takes effect; a record of a world-less key (bad JSON) likewise."""
    clock = Clock()
    first = Worker(dl_settings, clock)
    try:
        await first.applier.process([rec(dl_settings, world, 0, "N", "p", version=2)])
        await first.applier.process([rec(dl_settings, world, 1, "O", "p", version=1)])  # stale: p is at version 2
        bad = RawRecord(dl_settings.objects_topic, 0, 2, f"{world}::x".encode(), b"{broken", [], "h2")
        await first.applier.process([bad, rec(dl_settings, world, 3, "E", "e", caused_by="C")])
        clock.now += 10  # past the causal timeout
        await first.applier.tick()
    finally:
        await first.close()
    got = await letters(dl_settings)
    assert got == [(1, "stale-version"), (2, "malformed-json"), (3, "cause-missing")]
    second = Worker(dl_settings, clock)
    try:
        acks = await second.applier.process([rec(dl_settings, world, 0, "C", "c", partition=1)])
        records = [rec(dl_settings, world, i, e, pk, version=v) for i, e, pk, v in ((0, "N", "p", 2), (1, "O", "p", 1))]
        records += [bad, rec(dl_settings, world, 3, "E", "e", caused_by="C")]
        acks += await second.applier.process(records)
        acks += await second.applier.tick()
        replays = second.applier.totals["dead_letter_replays"]
    finally:
        await second.close()
    assert await letters(dl_settings) == got
    assert set(read_world(dl_settings, world).event_ids) == {"N", "O", "C"}  # O logged stale, E never
    assert sorted(acks) == ["h0", "h0", "h1", "h2", "h3"]  # C's h0 (partition 1) and 0..3 of partition 0
    assert replays == 3


async def test_decisions_are_recorded_with_the_ttl_and_found_in_one_lookup(dl_settings: Settings, unique: str) -> None:
    marks = DeadLetterMarks.from_url(dl_settings.redis_url, 120)
    try:
        keys = [dead_key((f"t-{unique}", 0, i), w) for i, w in enumerate([None, "w1", unique[:20].lower(), None])]
        assert await marks.record(keys[:2]) == 2
        assert await marks.record(keys[2:3], pending(1234)) == 1
        assert await marks.states(keys) == {keys[0]: CONFIRMED, keys[1]: CONFIRMED, keys[2]: b"p:1234"}
        ttl = await marks._redis.ttl(keys[1])  # noqa: SLF001
        assert 0 < ttl <= 120
        await marks._redis.delete(*keys)  # noqa: SLF001
    finally:
        await marks.close()


async def test_a_void_pending_decision_is_deleted_unless_it_was_confirmed_since(
    dl_settings: Settings, unique: str
) -> None:
    marks = DeadLetterMarks.from_url(dl_settings.redis_url, 120)
    try:
        void, confirmed_since = (dead_key((f"t-{unique}", 0, i), "w1") for i in (0, 1))
        other_slot = dead_key((f"t-{unique}", 0, 2), None)
        await marks.record([void, confirmed_since, other_slot], pending(1234))
        read = await marks.states([void, confirmed_since, other_slot])
        await marks.record([confirmed_since])  # a live worker's letter was confirmed after the read
        assert await marks.forget(read) == 2
        assert await marks.states([void, confirmed_since, other_slot]) == {confirmed_since: CONFIRMED}
        await marks._redis.delete(confirmed_since)  # noqa: SLF001
    finally:
        await marks.close()
