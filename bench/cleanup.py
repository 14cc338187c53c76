"""What a benchmark run leaves behind, removed when it ends: its branches, topics, Redis keys and
warehouse files.

Why: runs left everything, and a machine that ran them for three days held 3,930 Nessie references
(1.8 GB of Nessie data), 2,222 Kafka topics (28 GB) and 22 GB of warehouses under /tmp on a disk
with 23 GB free (docs/benchmarks.md, "2026-12-03 late morning"). Every name a run makes holds its
unique id (``Run.unique``: branches ``bench-<u>-…`` and ``world-b<u>-…``, topics ``bench.<u>.…``
and the Faust app's ``bench-<u>-…``), so that id selects exactly what to remove.

Redis keys went unremoved until 2026-12-03 afternoon: the dead-letter decisions of a run's topics
(``causeway:dead:{bench.<u>.…}``, one a bad record, kept 7 days), its worlds' marks and decisions
(``…{b<u>-N}…``) and the ceiling's ``bench:<u>:…`` keys. A box that had run the benchmark all day
held 904k keys and 1.2 GB in Redis, most of them from finished runs.

The logs, stats and profiles in the work directory stay (small, and what a result's ``work_dir``
points at); ``--keep`` on the command line keeps everything for inspection.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient

from sinks.nessie import SyncNessieClient
from streams.security import kafka_client_options, redis_options
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


def keys_made_by(keys: Iterable[str], unique: str) -> list[str]:
    """The Redis keys a run with id ``unique`` made: keyed by its topics (``.<u>.``), by its worlds
    (``b<u>-N``, in a hash tag or, in the old mark format, as a key part) or the ceiling's (``bench:<u>:``)."""
    marks = (f".{unique}.", f"{{b{unique}-", f":b{unique}-", f"bench:{unique}:")
    return sorted(k for k in keys if any(m in k for m in marks))


async def remove_redis_keys(settings: Settings, unique: str) -> int:
    """Unlink the run's Redis keys (one SCAN for keys holding its id, then the name rule); returns how many."""
    client = aioredis.Redis.from_url(settings.redis_url, **redis_options(settings))
    removed = 0
    try:
        found = [k.decode() async for k in client.scan_iter(match=f"*{unique}*", count=10_000)]
        mine = keys_made_by(found, unique)
        for start in range(0, len(mine), 5_000):
            removed += int(await client.unlink(*mine[start : start + 5_000]))
        return removed
    finally:
        await client.aclose()


def remove_warehouses(work: Path) -> int:
    """Delete the warehouses under a run's work directory (``<contender>/warehouse``); returns how many."""
    removed = 0
    for path in sorted(work.glob("*/warehouse")):
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


async def clean(run: Any) -> dict[str, int]:
    """Remove what ``run`` (a ``bench.harness.Run``) made; what was removed, by kind."""
    out = {"branches": 0, "topics": 0, "redis_keys": 0, "warehouses": 0}
    try:
        out["branches"] = remove_branches(run.client, run.unique)
    except Exception as exc:  # noqa: BLE001 - Nessie down: reported, the run's results stand
        log.warning("branches of run %s not listed: %s", run.unique, exc)
    try:
        out["topics"] = await remove_topics(run.base, run.unique)
    except Exception as exc:  # noqa: BLE001 - Kafka down: reported
        log.warning("topics of run %s not deleted: %s", run.unique, exc)
    try:
        out["redis_keys"] = await remove_redis_keys(run.base, run.unique)
    except Exception as exc:  # noqa: BLE001 - Redis down: reported
        log.warning("Redis keys of run %s not removed: %s", run.unique, exc)
    out["warehouses"] = remove_warehouses(run.work)
    return out
