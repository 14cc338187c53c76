"""The membership fence's one reader of aiokafka's private group state (``group_membership``).

aiokafka 0.14 has no public API for the group generation or a pending rejoin. These tests build
aiokafka's own coordinator, so an upgrade that moves ``AIOKAFKA_MEMBERSHIP`` fails here, and check
that a consumer whose internals do not answer is fenced by its commit alone, with an error logged.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import CommitFailedError

from agents import intake as intake_module
from agents.intake import AIOKAFKA_MEMBERSHIP, group_membership
from tests.fakes import event
from tests.unit.test_agents_intake import P0, FakeConsumer, intake_with, record


async def test_aiokafkas_own_coordinator_answers_where_the_fence_reads_it() -> None:
    """A consumer subscribed but not joined: aiokafka says a rejoin is needed (False, not None:
    the state was found); a reset generation (what UNKNOWN_MEMBER_ID leaves) is False too."""
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


async def test_a_consumer_not_started_is_not_known_and_is_fenced_by_its_commit() -> None:
    consumer = AIOKafkaConsumer(group_id="g", bootstrap_servers="127.0.0.1:9")
    try:
        assert group_membership(consumer) is None
    finally:
        await consumer._client.close()  # noqa: SLF001


async def test_internals_that_moved_log_an_error_and_the_fence_falls_back_to_its_commit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A coordinator without ``generation``/``need_rejoin`` (an aiokafka that moved them): the
    fence neither crashes nor refuses every expiry; the coordinator's answer to the commit decides."""
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
