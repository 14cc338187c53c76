"""An applier on the real Redis and Nessie with in-memory DLQ, world checks and clock, and the raw
change records to feed it: the exactly-once and dead-letter-marks tests build on it (with the ``world`` and
``eo_settings`` fixtures of conftest.py)."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from agents.applier import Applier, RawRecord
from models.deadletter import DeadLetter
from monitoring.metrics import Metrics
from sinks.committer import BatchCommitter
from streams.settings import Settings
from tests.fakes import FakeMarks as Marks

OBJ = "onto.changes.objects"


class Crash(BaseException):
    """A kill -9 at a point of the flush: nothing after it runs (BaseException escapes retries)."""


class Dlq:
    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []
        self.crash_next = False

    async def publish(self, letters: Sequence[DeadLetter]) -> None:
        if self.crash_next:
            self.crash_next = False
            raise Crash
        self.letters.extend(letters)


class Worlds:
    async def exists(self, world_id: str) -> bool:
        return True

    async def ensure(self, world_id: str) -> None:
        raise AssertionError("worlds exist in these tests")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def applier(settings: Settings, marks: Marks, dlq: Dlq, clock: Clock) -> Applier:
    return Applier(
        settings,
        marks=marks,
        committer=BatchCommitter(settings),
        dead_letters=dlq,
        worlds=Worlds(),
        metrics=Metrics(),
        clock=clock,
    )


def rec(
    world: str, offset: int, eid: str, pk: str, *, version: int = 1, caused_by: str | None = None, partition: int = 0
) -> RawRecord:
    doc = {
        "event_id": eid,
        "world_id": world,
        "object_type": "T",
        "object_pk": pk,
        "change_type": "CREATE" if version == 1 else "UPDATE",
        "after_properties": {"v": version},
        "version": version,
        "occurred_at": 0,
        "caused_by": caused_by,
    }
    return RawRecord(OBJ, partition, offset, f"{world}::{pk}".encode(), orjson.dumps(doc), [], f"h{offset}")
