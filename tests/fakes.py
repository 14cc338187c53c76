"""In-memory stand-ins for the applier's Redis marks, committer, DLQ and world checks, and the raw
change records they are fed: shared by the unit and integration tests of the applier."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from agents.applier import Applier, RawRecord
from models.deadletter import DeadLetter
from monitoring.metrics import Metrics
from sinks.committer import Batch, CommitOutcome
from sinks.errors import NessieUnavailable
from streams.settings import Settings


class FakeMarks:
    def __init__(self) -> None:
        self.marked: set[tuple[str, str]] = set()

    async def applied(self, pairs: Any) -> set[tuple[str, str]]:
        return {p for p in pairs if p in self.marked}

    async def mark(self, pairs: Any) -> int:
        self.marked |= set(pairs)
        return len(pairs)


class HeldMarks(FakeMarks):
    """FakeMarks whose dedupe lookups or mark writes wait while held (a poll, or a settle, stopped
    in its Redis round trip), and whose writes fail while ``failing``."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups_open, self.writes_open = asyncio.Event(), asyncio.Event()
        self.lookups_open.set()
        self.writes_open.set()
        self.waiting: list[str] = []  # "lookup" / "write": calls held now
        self.failing = False

    async def _held(self, what: str, open_: asyncio.Event) -> None:
        if not open_.is_set():
            self.waiting.append(what)
            await open_.wait()
            self.waiting.remove(what)

    async def applied(self, pairs: Any) -> set[tuple[str, str]]:
        await self._held("lookup", self.lookups_open)
        return await super().applied(pairs)

    async def mark(self, pairs: Any) -> int:
        await self._held("write", self.writes_open)
        if self.failing:
            raise ConnectionError("redis unreachable")
        return await super().mark(pairs)


class FakeCommitter:
    def __init__(self) -> None:
        self.batches: list[Batch] = []

    async def commit_batch_async(self, batch: Batch) -> CommitOutcome:
        self.batches.append(batch)
        return CommitOutcome(batch.world_id, batch.batch_id, "main", "h" * 64, 1, False, len(batch.events), 0, 0, 0.01)


class NessieDown:
    """A committer whose commits fail (Nessie unreachable) while ``down``; counts the attempts."""

    def __init__(self) -> None:
        self.inner = FakeCommitter()
        self.down = True
        self.attempts = 0
        self.failing = asyncio.Event()

    @property
    def batches(self) -> list[Batch]:
        return self.inner.batches

    async def commit_batch_async(self, batch: Batch) -> CommitOutcome:
        self.attempts += 1
        if self.down:
            self.failing.set()
            raise NessieUnavailable("connection refused")
        return await self.inner.commit_batch_async(batch)


class FakeDlq:
    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []

    async def publish(self, letters: Sequence[DeadLetter]) -> None:
        self.letters.extend(letters)

    async def start(self) -> None:  # the intake starts its applier's publisher
        pass

    async def stop(self) -> None:
        pass


class FakeWorlds:
    async def exists(self, world_id: str) -> bool:
        return world_id == "prod"

    async def ensure(self, world_id: str) -> None:
        raise AssertionError("policy is dlq")


def applier_with(
    settings: Settings,
    committer: Any,
    marks: Any,
    *,
    worlds: Any = None,
    pipelined: bool = False,
    clock: Callable[[], float] = lambda: 100.0,
) -> Applier:
    """An applier on fakes (a fresh DLQ, the world ``prod`` unless ``worlds``), its clock at 100
    unless ``clock``."""
    return Applier(
        settings,
        marks=marks,
        committer=committer,
        dead_letters=FakeDlq(),
        worlds=worlds or FakeWorlds(),
        metrics=Metrics(),
        clock=clock,
        pipelined=pipelined,
    )


def make() -> tuple[Applier, FakeCommitter, FakeDlq, FakeMarks]:
    settings = Settings.from_env({}).replace(batch_max_events=100, batch_max_seconds=0.0)
    committer, marks = FakeCommitter(), FakeMarks()
    applier = applier_with(settings, committer, marks)
    assert isinstance(applier.dlq, FakeDlq)
    return applier, committer, applier.dlq, marks


def event(n: int, world: str = "prod", caused_by: str | None = None) -> bytes:
    return orjson.dumps(
        {
            "event_id": f"e{n}",
            "world_id": world,
            "object_type": "T",
            "object_pk": f"p{n}",
            "change_type": "CREATE",
            "after_properties": {},
            "version": 1,
            "occurred_at": 0,
            "caused_by": caused_by,
        }
    )


def rec(offset: int, value: bytes, key: bytes | None = None, headers: list | None = None) -> RawRecord:
    if key is None:
        doc = orjson.loads(value)
        key = f"{doc['world_id']}::{doc['object_pk']}".encode()
    return RawRecord("onto.changes.objects", 0, offset, key, value, headers or [], f"h{offset}")
