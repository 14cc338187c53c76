"""A world whose table files are gone, end to end: real Kafka, Redis, Nessie, a worker process.

Its branch points at metadata JSON that was deleted (here: moved out of the test's own warehouse).
The worker must dead-letter that world's events as ``world-unreadable`` with the missing path,
never mark them applied, and keep every other world flowing; once the files are back, a redrive
applies them. Before the fix the FileNotFoundError was retried as an outage and nothing drained.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path
from urllib.parse import urlparse

import pytest
from click.testing import CliRunner

from agents.marks import AppliedMarks
from cli.main import cli
from cli.workload import Record
from models.events import ChangeEvent, ChangeType
from models.worlds import WorldNaming
from sinks.nessie import IcebergTable, SyncNessieClient
from sinks.tables import COMMON, EDGE, EVENTS
from tests.factories import change_event
from tests.integration.pipeline import Pipeline

pytestmark = pytest.mark.integration


def _record(pipe: Pipeline, world: str, n: int) -> tuple[Record, ChangeEvent]:
    ev = change_event(
        f"{pipe.unique}-{world}-{n}",
        world=world,
        entity_type="Sensor",
        pk=f"p{n}",
        change=ChangeType.CREATE,
        version=1,
        after={"n": n},
    )
    return Record(ev.kind, ev.key.encode(), ev.encode(), ev), ev


def _metadata_files(pipe: Pipeline, world: str) -> list[Path]:
    """The metadata JSON files the world's branch points at (local warehouse)."""
    s = pipe.settings
    branch = WorldNaming(s.prod_world, s.main_branch).branch(world)
    with SyncNessieClient(s.nessie_url) as client:
        found = client.get_contents(branch, [(s.namespace, d.name) for d in (EVENTS, COMMON, EDGE)])
    return [Path(urlparse(c.metadata_location).path) for c in found.values() if isinstance(c, IcebergTable)]


async def test_a_world_whose_metadata_is_deleted_is_dead_lettered_and_the_others_flow(
    unique: str, tmp_path: Path
) -> None:
    pipe = await Pipeline.create(unique, tmp_path, batch_max_seconds=0.2)
    broken, healthy = f"u{unique[:8]}-broken", f"u{unique[:8]}-ok"
    try:
        warm = pipe.start_worker()
        first = [_record(pipe, broken, 0), _record(pipe, healthy, 0)]
        await pipe.publish([r for r, _ in first])
        await pipe.wait_drained(timeout=90)
        files = _metadata_files(pipe, broken)
        assert files, "the broken world's tables were created"
        aside = tmp_path / "aside"
        aside.mkdir()
        # A worker keeps each table's metadata in memory (sinks.table_metadata), so one that already
        # committed to the world never reads these files again: the one that meets them missing is a
        # worker started after they went (a restart, or another worker taking the partitions).
        pipe.kill(warm, signal.SIGTERM)
        for f in files:  # the "deleted" warehouse files, kept aside to repair the world later
            shutil.move(f, aside / f.name)
        worker = pipe.start_worker()

        lost = [_record(pipe, broken, n) for n in (1, 2)]
        landed = [_record(pipe, healthy, n) for n in (1, 2, 3)]
        await pipe.publish([r for r, _ in lost + landed])
        await pipe.wait_drained(timeout=90)  # before the fix: lag never reached 0

        assert {ev.event_id for _, ev in first[1:] + landed} <= set(pipe.state(healthy).event_ids)
        letters = [dl for dl in await pipe.dead_letters() if dl.world_id == broken]
        assert sorted(str(dl.event_id) for dl in letters) == sorted(ev.event_id for _, ev in lost)
        assert {dl.reason for dl in letters} == {"world-unreadable"}
        assert all(any(str(f) in dl.detail for f in files) for dl in letters), [dl.detail for dl in letters]
        marks = AppliedMarks.from_settings(pipe.settings)
        try:
            assert not await marks.applied([(broken, ev.event_id) for _, ev in lost])
        finally:
            await marks.close()
        metrics = worker.metrics_text()
        counted = [
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("causeway_events_total{")
            and all(x in line for x in (f'world="{broken}"', 'outcome="dead_lettered"', 'reason="world-unreadable"'))
        ]
        assert counted == [2.0], counted

        # Repaired (the files are back): a redrive applies the letters exactly once.
        for f in files:
            shutil.move(aside / f.name, f)
        env = pipe.env
        result = await asyncio.to_thread(
            CliRunner().invoke, cli, ["dlq", "redrive", "--reason", "world-unreadable", "--world", broken], env=env
        )
        assert result.exit_code == 0, result.output
        await pipe.wait_drained(timeout=90)
        state = pipe.state(broken)
        assert all(state.event_ids[ev.event_id] == 1 for _, ev in first[:1] + lost)
    finally:
        pipe.stop_all()
