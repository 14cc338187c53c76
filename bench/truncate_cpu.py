"""CPU per commit of a batch of a once-truncated type on a world with a large event log.

Seeds a fresh world branch with ``--seed-batches`` commits of ``--seed-events`` events (type
``person``, distinct keys, so the log holds ``seed-batches x seed-events`` rows), truncates
``person``, reloads ``--keys`` keys above the versions the truncate removed, then commits
``--commits`` batches of ``--events`` updates of those live keys and reports this process's CPU
seconds per measured commit (``time.process_time``: the box is shared), the event ids looked up
in the log per commit, and the CPU of the truncate's own commit. Imports only ``sinks``,
``models`` and ``streams``, so the same file measures another tree:
``PYTHONPATH=/path/to/other/tree python bench/truncate_cpu.py``.

    python bench/truncate_cpu.py --seed-batches 10 --seed-events 20000 --commits 8 --events 2000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from typing import Any

import sinks.committer as committer_module
from bench.scratch import drop_world, scratch_world
from models.events import ChangeEvent, ChangeType, EntityKind, validate
from sinks.committer import Batch
from streams.settings import Settings


def _event(world: str, pk: str, change: ChangeType, version: int) -> ChangeEvent:
    """An object event of type ``person`` as a producer sends it (the wire contract builds it)."""
    doc: dict[str, object] = {
        "event_id": f"{pk}-{version}-{uuid.uuid4().hex[:12]}",
        "world_id": world,
        "object_type": "person",
        "change_type": change.value,
        "version": version,
        "occurred_at": 1_700_000_000_000,
    }
    if change is not ChangeType.TRUNCATE:
        doc |= {"object_pk": pk, "after_properties": {"v": version}}
    return validate(doc, EntityKind.OBJECT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed-batches", type=int, default=10)
    ap.add_argument("--seed-events", type=int, default=20000)
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--commits", type=int, default=8)
    ap.add_argument("--events", type=int, default=2000)
    args = ap.parse_args()

    settings, client, world, committer = scratch_world("trc", Settings.from_env())

    looked_up = [0]
    logged = committer_module.logged_events

    def counting(table: Any, ids: set[str], cache: Any = None) -> dict[str, bool]:
        looked_up[0] += len(ids)
        return logged(table, ids, cache)

    committer_module.logged_events = counting
    cpu: list[float] = []
    ids: list[int] = []
    try:
        for b in range(args.seed_batches):
            seed = [_event(world, f"s{b}-{n}", ChangeType.CREATE, 1) for n in range(args.seed_events)]
            committer.commit_batch(Batch(world, f"seed-{b}", seed))
        t0 = time.process_time()
        committer.commit_batch(Batch(world, "truncate", [_event(world, "*", ChangeType.TRUNCATE, 1)]))
        truncate_cpu = time.process_time() - t0
        keys = [f"k{n}" for n in range(args.keys)]
        committer.commit_batch(Batch(world, "reload", [_event(world, k, ChangeType.CREATE, 2) for k in keys]))
        for i in range(args.commits):
            batch = [
                _event(world, keys[(i * args.events + n) % len(keys)], ChangeType.UPDATE, 3 + i)
                for n in range(args.events)
            ]
            looked_up[0] = 0
            t0 = time.process_time()
            committer.commit_batch(Batch(world, f"upd-{i}", batch))
            cpu.append(time.process_time() - t0)
            ids.append(looked_up[0])
    finally:
        committer_module.logged_events = logged
        drop_world(client, world)
    print(
        json.dumps(
            {
                "run": world,
                "tree": os.environ.get("PYTHONPATH", ""),
                "log_rows": args.seed_batches * args.seed_events + 1 + args.keys,
                "events_per_commit": args.events,
                "cpu_s_per_commit_mean": round(statistics.mean(cpu), 4),
                "cpu_s_per_commit_median": round(statistics.median(cpu), 4),
                "ids_looked_up_per_commit": statistics.mean(ids),
                "truncate_commit_cpu_s": round(truncate_cpu, 4),
                "loadavg": open("/proc/loadavg").read().split()[:3],
            }
        )
    )


if __name__ == "__main__":
    main()
