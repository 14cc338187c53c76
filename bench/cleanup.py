"""What a benchmark run leaves behind, removed when it ends: its branches, topics and warehouse files.

Why: runs left everything, and a machine that ran them for three days held 3,930 Nessie references
(1.8 GB of Nessie data), 2,222 Kafka topics (28 GB) and 22 GB of warehouses under /tmp on a disk
with 23 GB free (docs/benchmarks.md, "2026-12-03 late morning"). Every name a run makes holds its
unique id (``Run.unique``: branches ``bench-<u>-…`` and ``world-b<u>-…``, topics ``bench.<u>.…``
and the Faust app's ``bench-<u>-…``), so that id selects exactly what to remove.

The logs, stats and profiles in the work directory stay (small, and what a result's ``work_dir``
points at); ``--keep`` on the command line keeps everything for inspection.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from sinks.nessie import SyncNessieClient
from streams.security import kafka_client_options
from streams.settings import Settings

log = logging.getLogger(__name__)


def made_by(names: Iterable[str], unique: str) -> list[str]:
    """The names a run with id ``unique`` made: its id as a name part (``-<u>-``, ``.<u>.``, ``b<u>-``)."""
    marks = (f"-{unique}-", f".{unique}.", f"-b{unique}-", f"bench-{unique}")
    return sorted(n for n in names if any(m in n for m in marks))


def remove_branches(client: SyncNessieClient, unique: str) -> int:
    """Delete the run's branches; returns how many. A branch that moved or went meanwhile is skipped."""
    refs = {r.name: r for r in client.list_references() if r.type == "BRANCH"}
    removed = 0
    for name in made_by(refs, unique):
        try:
            client.delete_reference(name, refs[name].hash)
            removed += 1
        except Exception as exc:  # noqa: BLE001 - cleaning up is best effort, reported
            log.warning("branch %s not deleted: %s", name, exc)
    return removed


async def remove_topics(settings: Settings, unique: str) -> int:
    """Delete the run's Kafka topics; returns how many."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **kafka_client_options(settings))
    await admin.start()
    try:
        topics = made_by(await admin.list_topics(), unique)
        if topics:
            await admin.delete_topics(topics)
        return len(topics)
    finally:
        await admin.close()


def remove_warehouses(work: Path) -> int:
    """Delete the warehouses under a run's work directory (``<contender>/warehouse``); returns how many."""
    removed = 0
    for path in sorted(work.glob("*/warehouse")):
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


async def clean(run: Any) -> dict[str, int]:
    """Remove what ``run`` (a ``bench.harness.Run``) made; what was removed, by kind."""
    out = {"branches": 0, "topics": 0, "warehouses": 0}
    try:
        out["branches"] = remove_branches(run.client, run.unique)
    except Exception as exc:  # noqa: BLE001 - Nessie down: reported, the run's results stand
        log.warning("branches of run %s not listed: %s", run.unique, exc)
    try:
        out["topics"] = await remove_topics(run.base, run.unique)
    except Exception as exc:  # noqa: BLE001 - Kafka down: reported
        log.warning("topics of run %s not deleted: %s", run.unique, exc)
    out["warehouses"] = remove_warehouses(run.work)
    return out
