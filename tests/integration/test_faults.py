"""Fault injection: kill -9 workers at each point of a flush and at random times, restart, and
compare the branches with the model. Every kill is a real SIGKILL of a worker process."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import pytest

from agents.faults import POINTS
from bench.workload import generate
from tests.integration.pipeline import Pipeline
from tests.integration.test_applier import assert_matches_model

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("point", POINTS)
async def test_kill_at_each_flush_point(point: str, unique: str, tmp_path: Path) -> None:
    pipe = await Pipeline.create(unique, tmp_path, batch_max_events=150, batch_max_seconds=0.3)
    try:
        wl = generate(pipe.params(events=1500, worlds=2, keys=60, seed=31, duplicate_rate=0.05))
        await pipe.publish(wl.records)
        kills = 0
        for nth in (1, 2, 3):
            worker = pipe.start_worker(fault=f"{point}:{nth}", wait=False)
            worker.proc.wait(timeout=120)
            assert worker.proc.returncode == -signal.SIGKILL, worker.log.read_text()[-2000:]
            kills += 1
        pipe.start_worker()
        await pipe.wait_drained(timeout=180)
        assert_matches_model(pipe, wl.valid_events)
        print(f"fault point {point}: {kills} kills, model matched")
    finally:
        pipe.stop_all()


async def test_random_kills(unique: str, tmp_path: Path) -> None:
    rng = random.Random(unique)
    pipe = await Pipeline.create(unique, tmp_path, batch_max_events=200, batch_max_seconds=0.3)
    try:
        wl = generate(pipe.params(events=3000, worlds=3, keys=80, seed=41, duplicate_rate=0.05))
        third = len(wl.records) // 3
        await pipe.publish(wl.records[:third])
        kills = 0
        for i in range(11):
            worker = pipe.start_worker()
            if i == 3:
                await pipe.publish(wl.records[third : 2 * third])
            if i == 7:
                await pipe.publish(wl.records[2 * third :])
            await asyncio.sleep(rng.uniform(0.2, 2.5))
            pipe.kill(worker)
            kills += 1
        pipe.start_worker()
        await pipe.wait_drained(timeout=240)
        assert_matches_model(pipe, wl.valid_events)
        print(f"random kills: {kills} kills, model matched")
    finally:
        pipe.stop_all()
