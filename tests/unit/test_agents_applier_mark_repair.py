"""Mark repair after an assignment: every id of the branch's newest commits is marked again, in
slices that leave the event loop free between Redis calls."""

from __future__ import annotations

import asyncio
from typing import Any

from agents import applier as applier_module
from agents.applier import Applier
from monitoring.metrics import Metrics
from streams.settings import Settings
from tests.fakes import FakeCommitter, FakeDlq, FakeMarks, FakeWorlds, event, rec


class CountingMarks(FakeMarks):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    async def mark(self, pairs: Any) -> int:
        self.calls.append(len(pairs))
        await asyncio.sleep(0)
        return await super().mark(pairs)


async def test_a_branch_with_many_recent_ids_is_re_marked_in_slices_and_the_loop_keeps_running() -> None:
    ids = [f"old{i}" for i in range(2 * applier_module.REPAIR_MARK_SLICE + 7)]
    marks = CountingMarks()

    async def recent(world: str) -> list[str]:
        return ids if world == "prod" else []

    applier = Applier(
        Settings.from_env({}).replace(batch_max_events=100, batch_max_seconds=0.0),
        marks=marks,
        committer=FakeCommitter(),
        dead_letters=FakeDlq(),
        worlds=FakeWorlds(),
        metrics=Metrics(),
        clock=lambda: 100.0,
        recent_event_ids=recent,
    )
    ticks = 0

    async def heartbeat() -> None:  # stands in for aiokafka's heartbeat task on the same loop
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    beat = asyncio.create_task(heartbeat())
    try:
        await applier.process([rec(0, event(1))])
    finally:
        beat.cancel()
    assert {("prod", i) for i in ids} <= marks.marked
    assert max(marks.calls[:3]) == applier_module.REPAIR_MARK_SLICE
    assert sum(marks.calls[:3]) == len(ids) and len(marks.calls[:3]) == 3
    assert ticks >= 3  # the loop ran other tasks between the slices
