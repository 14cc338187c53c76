"""Bounded dedupe state end to end: real Redis marks for the window, the branch's event log after it.

The applier runs with the real committer on a real Nessie branch and the real ``AppliedMarks`` on
the real Redis, with a wall clock the test moves past the dedupe window.
"""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from agents.marks import AppliedMarks
from sinks.readback import read_world
from streams.settings import Settings
from tests.integration import test_exactly_once as eo
from tests.integration.test_exactly_once import Dlq, applier, rec

pytestmark = pytest.mark.integration

# The exactly-once suite's fixtures: a fresh world branch, settings with a private warehouse.
world = eo.world
eo_settings = eo.eo_settings

WINDOW = 60


class WallClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_a_duplicate_older_than_the_window_is_still_caught_by_the_event_log(
    world: str,
    eo_settings: Settings,
    redis_url: str,
) -> None:
    wall = WallClock()
    started = wall.now
    marks = AppliedMarks.from_url(redis_url, WINDOW, buckets=4, clock=wall)
    dlq = Dlq()
    try:
        first = applier(eo_settings, marks, dlq, lambda: 1000.0)  # type: ignore[arg-type]
        await first.process([rec(world, 0, "A", "p"), rec(world, 1, "B", "q")])
        assert first.totals["applied"] == 2

        # Inside the window: a producer-retry copy is dropped at intake by its Redis mark, no commit.
        inside = applier(eo_settings, marks, dlq, lambda: 1000.0)  # type: ignore[arg-type]
        assert await inside.process([rec(world, 5, "A", "p")]) == ["h5"]
        assert inside.totals["duplicates"] == 1 and inside.totals.get("commits", 0) == 0

        # Past the window (and the slot that may outlive it): Redis no longer knows A ...
        wall.now += WINDOW + WINDOW // 2 + 1
        assert await marks.applied([(world, "A"), (world, "B")]) == set()
        # ... a copy reaches the committer, whose version check flags it and the event log confirms it:
        # a duplicate, not applied twice and not dead-lettered as stale. A new event still applies.
        after = applier(eo_settings, marks, dlq, lambda: 1000.0)  # type: ignore[arg-type]
        acks = await after.process([rec(world, 9, "A", "p"), rec(world, 10, "C", "r")])
        assert acks == ["h9", "h10"]
        assert not dlq.letters
        assert after.totals["duplicates"] == 1 and after.totals["applied"] == 1
        state = read_world(eo_settings, world)
        assert state.event_ids == {"A": 1, "B": 1, "C": 1}
        # The copy is marked again for a window (it was settled as a duplicate).
        assert (world, "A") in await marks.applied([(world, "A")])
    finally:
        client = aioredis.Redis.from_url(redis_url)
        keys = marks.keys_of(world, started) + marks.keys_of(world, wall.now)
        for i in range(0, len(keys), 5000):
            await client.unlink(*keys[i : i + 5000])
        await client.aclose()
        await marks.close()
