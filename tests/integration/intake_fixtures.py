"""Shared by the intake's integration tests: an intake over fakes (real Kafka, stand-in services) and a wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from agents.applier import Applier
from agents.intake import ChangeIntake
from monitoring.metrics import Metrics
from streams.settings import Settings
from tests.fakes import FakeCommitter, FakeDlq, FakeMarks, FakeWorlds, NessieDown


def intake(settings: Settings, committer: FakeCommitter | NessieDown) -> ChangeIntake:
    """A real ``ChangeIntake`` (real Kafka group) whose applier commits through ``committer``."""
    applier = Applier(
        settings,
        marks=FakeMarks(),
        committer=committer,
        dead_letters=FakeDlq(),
        worlds=FakeWorlds(),
        metrics=Metrics(),
        pipelined=True,
    )
    return ChangeIntake(settings, applier)


async def until(check: Callable[[], bool], seconds: float, every: float = 0.1) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(every)
