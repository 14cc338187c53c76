"""A step stuck on a failing dependency gives up for a rebalance and a stop, with the real Kafka group.

The real services must not be cut here (others use them): Nessie is either a stand-in that refuses
every commit, or reached through a proxy the test cuts; Kafka is real, so the rebalance, its revoke
listener and the committed offsets are aiokafka's.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from cli.workload import generate
from streams.settings import Settings
from tests.fakes import FakeCommitter, NessieDown
from tests.integration.intake_fixtures import intake, one_partition_group, until
from tests.integration.pipeline import Pipeline, assert_matches_model
from tests.integration.proxy import proxied

pytestmark = pytest.mark.integration


async def test_a_worker_stuck_on_a_failing_commit_lets_a_rebalance_and_its_stop_through(
    settings: Settings, unique: str
) -> None:
    """Worker A reads two events and retries their commit (Nessie down); worker B joins the group.
    Before, A's revoke listener waited for the lock A's step held for as long as the outage lasted,
    so the group's rebalance stalled until the broker evicted A (its poll interval, 5 minutes).
    Now A's step gives up, the rebalance completes, A stops long before its shutdown timeout, and B
    commits both events from offset 0: A acked nothing."""
    s = await one_partition_group(settings, "giveup", unique, events=2)
    down, healthy = NessieDown(), FakeCommitter()
    a, b = intake(s, down), intake(s, healthy)
    await a.start()
    runs = [asyncio.create_task(a.run())]
    try:
        await asyncio.wait_for(down.failing.wait(), 60)
        await b.start()
        runs.append(asyncio.create_task(b.run()))
        await until(lambda: a.generation >= 1, 60)  # A's revoke ran: it needed the lock A's step held
        started = time.monotonic()
        await asyncio.wait_for(a.stop(), 30)
        assert time.monotonic() - started < s.shutdown_timeout_s
        await until(lambda: [e.event_id for bt in healthy.batches for e in bt.events] == ["e0", "e1"], 90)
        assert down.batches == [] and a.applier.tracker.in_flight() == 0
        await until(lambda: 2 in b._committed.values(), 30)  # noqa: SLF001
    finally:
        await a.stop()
        await b.stop()
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)


async def test_a_worker_stopped_during_a_nessie_outage_exits_at_once_and_loses_nothing(
    unique: str, tmp_path: Path
) -> None:
    """A real worker whose Nessie connection is cut (a proxy: the shared server keeps running) is
    retrying its commits when it gets SIGTERM. Before, it waited out ``CAUSEWAY_SHUTDOWN_TIMEOUT_S``
    (120 s here) with its step holding the intake's lock; now the step gives up and the worker exits
    within seconds, having acked nothing: the next worker applies every event once."""
    proxy, nessie_url = proxied(Settings.from_env().nessie_url)
    pipe = await Pipeline.create(unique, tmp_path, nessie_url=nessie_url, shutdown_timeout_s=120.0)
    try:
        wl = generate(pipe.params(events=600, worlds=2, keys=40, seed=61))
        worker = pipe.start_worker()
        proxy.cut()
        await pipe.publish(wl.records)
        await until(lambda: "retrying in" in worker.log.read_text(), 120)
        started = time.monotonic()
        pipe.kill(worker, signal.SIGTERM)  # waits for the exit (at most 60 s)
        assert time.monotonic() - started < 30, "the stop waited for the shutdown timeout"
        assert "giving the step up" in worker.log.read_text()
        assert await pipe.lag() > 0, "nothing may be acked while Nessie is down"
        proxy.restore()
        pipe.start_worker()
        await pipe.wait_drained(timeout=180)
        assert len(await pipe.dead_letters()) == wl.bad_count
        assert_matches_model(pipe, wl.valid_events)
    finally:
        pipe.stop_all()
        proxy.close()
