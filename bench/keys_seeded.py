"""The keys axis at millions of keys: a world seeded with K objects, then updates through Kafka.

    python -m bench.keys_seeded --keys 5000000 --updates 200000     # causeway and the ceiling

``python -m bench run --profile keys-1m`` builds its world through Kafka from the demo workload,
which holds every record in memory (about 5 KB each) and creates a key for only ~20 % of its
events (2M records: ~370k keys): 5M keys would take 25M records. Here causeway's world branch is
seeded with K objects by the committer itself (``--seed-batch`` objects per commit, then 20
one-event commits so that the worker's mark repair of the newest 20 batches stays flush-sized;
before the worker starts, so the seed is neither timed nor counted as ingested), then ``--updates`` update
events over uniformly random seeded keys go through Kafka to the worker, as in any run; each
contender gets the same records. Worker memory is read as in every run (peak RSS of the worker
process). Rewrite amplification is also given without what seeding itself compacted
(``rewrite_amplification_after_seed``: bytes superseded since the seed per byte ingested).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyiceberg.exceptions import NoSuchTableError

from bench import measure
from bench.cleanup import clean
from bench.harness import RESULTS, Run, machine, ratios, save, versions
from bench.profiles import PROFILES
from bench.report import markdown
from cli.workload import BASE_TIME_MS, Record
from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.catalog import NessieCatalog
from sinks.committer import Batch, BatchCommitter, Source
from sinks.layout_run import TableLayouts
from sinks.tables import ENTITY_COMMON, ENTITY_EDGE, ENTITY_EVENTS

TYPES = ("Equipment", "Department", "Sensor")


def keyed_event(world: str, n: int, version: int, seq: int, tag: str) -> ChangeEvent:
    pk = f"obj-{n}"
    return ChangeEvent(
        event_id=f"{tag}-{seq}",
        world_id=world,
        kind=EntityKind.OBJECT,
        entity_type=TYPES[n % len(TYPES)],
        entity_pk=pk,
        change_type=ChangeType.CREATE if version == 1 else ChangeType.UPDATE,
        version=version,
        before=None,
        after={"name": pk, "status": "ok" if version > 1 else "new", "reading": round(n / 7 % 100, 3)},
        caused_by=None,
        causal_order=None,
        occurred_at_ms=BASE_TIME_MS + seq,
        schema_version=1,
        source="bench",
    )


class Updates:
    """``count`` updates of random keys among ``keys``, made on the fly (the same ones every iteration)."""

    def __init__(self, world: str, keys: int, count: int, seed: int, tag: str, first_version: int = 3) -> None:
        self.world, self.keys, self.count, self.seed, self.tag = world, keys, count, seed, tag
        self.first_version = first_version

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Record]:
        rng = random.Random(self.seed)
        versions: dict[int, int] = {}
        for seq in range(self.count):
            n = rng.randrange(self.keys)
            versions[n] = versions.get(n, self.first_version - 1) + 1
            ev = keyed_event(self.world, n, versions[n], seq, self.tag)
            yield Record(ev.kind, ev.key.encode(), ev.encode(), None)


TABLES = (ENTITY_EVENTS, ENTITY_COMMON, ENTITY_EDGE)


def superseded(root: Path, catalog: NessieCatalog, branch: str, namespace: str) -> dict[str, dict[str, int]]:
    """Per table, the Parquet bytes, rows and files on disk and those ``branch``'s snapshot still
    references, for data and delete files (``delete-*.parquet``) apart: where rewrites come from."""
    import pyarrow.parquet as pq

    out: dict[str, dict[str, int]] = {}
    for table in TABLES:
        row = {f"{kind}_{what}_{where}": 0 for kind in KINDS for what in MEASURES for where in ("disk", "live")}
        for d in root.rglob(f"{table}_*"):
            for f in d.rglob("*.parquet"):
                kind = "deletes" if f.name.startswith("delete-") else "data"
                row[f"{kind}_bytes_disk"] += f.stat().st_size
                row[f"{kind}_rows_disk"] += pq.ParquetFile(f).metadata.num_rows
                row[f"{kind}_files_disk"] += 1
        try:
            t = catalog.at(branch).load_table((namespace, table))
        except NoSuchTableError:
            out[table] = row
            continue
        deletes: dict[str, tuple[int, int]] = {}
        for task in t.scan().plan_files():
            row["data_bytes_live"] += task.file.file_size_in_bytes
            row["data_rows_live"] += task.file.record_count
            row["data_files_live"] += 1
            for df in task.delete_files:
                deletes[df.file_path] = (df.file_size_in_bytes, df.record_count)
        row["deletes_bytes_live"] = sum(b for b, _ in deletes.values())
        row["deletes_rows_live"] = sum(r for _, r in deletes.values())
        row["deletes_files_live"] = len(deletes)
        out[table] = row
    return out


KINDS = ("data", "deletes")
MEASURES = ("bytes", "rows", "files")


def superseded_since(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per table, what was written and what was superseded (on disk, no longer referenced) between two
    :func:`superseded` readings."""
    out = {}
    for table, a in after.items():
        b = before.get(table, {})
        row: dict[str, int] = {}
        for kind in KINDS:
            for what in MEASURES:
                disk, live = f"{kind}_{what}_disk", f"{kind}_{what}_live"
                row[f"{kind}_{what}_written"] = a[disk] - b.get(disk, 0)
                row[f"{kind}_{what}_superseded"] = (a[disk] - a[live]) - (b.get(disk, 0) - b.get(live, 0))
        out[table] = row
    return out


class SeededRun(Run):
    """A run whose causeway world branch holds ``keys`` objects before its worker starts."""

    def __init__(
        self, *args: Any, keys: int, seed_batch: int, layout: str = "default", buckets: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.keys, self.seed_batch, self.layout, self.buckets = keys, seed_batch, layout, buckets
        self.seed: dict[str, Any] = {}
        self.seed_tables: dict[str, dict[str, int]] = {}

    def _branch_from_root(self, name: str) -> None:
        super()._branch_from_root(name)
        plan = self.plan("causeway")
        if name != plan.settings.main_branch:
            return
        world = plan.settings.prod_world
        # The seeding committer creates the tables, so its bucket count is the world's (the worker writes
        # into tables that exist and keeps their spec).
        settings = plan.settings if self.buckets is None else plan.settings.replace(projection_buckets=self.buckets)
        committer = BatchCommitter(settings, self.client)
        started = time.monotonic()
        if self.layout == "none":
            # The layout before partitioning (unpartitioned, unsorted), for an A/B against the default:
            # one object outside the seeded range creates the tables, then all three are evolved.
            probe = keyed_event(world, self.keys + 100, 1, self.keys + 100, f"{self.unique}-seed")
            committer.commit_batch(Batch.from_sources(world, "seed-layout", [(probe, Source("seed", 1, 0))]))
            layouts = TableLayouts(plan.settings, committer)
            for table in (ENTITY_EVENTS, ENTITY_COMMON, ENTITY_EDGE):
                layouts.evolve_text(world, table, "none", "none")
            self.log("[seed] tables evolved to unpartitioned, unsorted")
        for first in range(0, self.keys, self.seed_batch):
            items = [
                (keyed_event(world, n, 1, n, f"{self.unique}-seed"), Source("seed", 0, n))
                for n in range(first, min(self.keys, first + self.seed_batch))
            ]
            committer.commit_batch(Batch.from_sources(world, f"seed-{first}", items))
            self.log(f"[seed] {first + len(items)} of {self.keys} objects")
        # The worker re-marks the event ids of a world's newest 20 batch commits in Redis when it first
        # sees the world (mark repair); seed commits are far larger than a flush, so end with 20
        # flush-sized ones, as a world built by workers would.
        for i in range(20):
            ev = keyed_event(world, i, 2, self.keys + i, f"{self.unique}-seed")
            committer.commit_batch(
                Batch.from_sources(world, f"seed-tail-{i}", [(ev, Source("seed", 0, self.keys + i))])
            )
        wh = measure.warehouse_sizes(measure.warehouse_path(plan.warehouse))
        catalog = NessieCatalog.from_settings(plan.settings, name, client=self.client)
        live = measure.live_bytes(catalog, [name], self.base.namespace, (ENTITY_EVENTS, ENTITY_COMMON, ENTITY_EDGE))
        self.seed = {"keys": self.keys, "seconds": round(time.monotonic() - started, 1)}
        self.seed |= {"data_bytes": wh.data_bytes, "live_bytes": live}
        try:
            self.seed_tables = superseded(measure.warehouse_path(plan.warehouse), catalog, name, self.base.namespace)
        except Exception as exc:  # noqa: BLE001 - a breakdown is extra; the run goes on without it
            self.log(f"[seed] no per-table breakdown: {exc!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000, help="objects seeded in the world")
    ap.add_argument("--updates", type=int, default=200_000, help="update events through Kafka (timed)")
    ap.add_argument("--seed-batch", type=int, default=250_000, help="objects per seeding commit")
    ap.add_argument("--contenders", default="ceiling,causeway")
    ap.add_argument("--latency-rate", type=int, default=1_000)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--layout",
        choices=("default", "none"),
        default="default",
        help="causeway's table layout: the default, or unpartitioned and unsorted (the layout before issue 21)",
    )
    ap.add_argument(
        "--buckets",
        type=int,
        default=None,
        help="buckets of a projection's key in the default layout (CAUSEWAY_PROJECTION_BUCKETS; 0: type only)",
    )
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the run's Nessie branches, Kafka topics and warehouse files (removed at the end by default)",
    )
    args = ap.parse_args(argv)
    profile = PROFILES["keys-1m"].with_(
        name=f"keys-seeded-{args.keys}"
        + ("-unpartitioned" if args.layout == "none" else "")
        + (f"-buckets{args.buckets}" if args.buckets is not None and args.layout == "default" else ""),
        events=args.updates,
        keys=args.keys,
        contenders=tuple(c.strip() for c in args.contenders.split(",") if c.strip()),
        latency_rate=args.latency_rate,
        latency_seconds=10.0,
        duplicate_rate=0.0,
        bad_rate=0.0,
        causal_share=0.0,
        update_share=1.0,
    )
    run = SeededRun(
        profile,
        out_dir=args.out,
        keys=args.keys,
        seed_batch=args.seed_batch,
        layout=args.layout,
        buckets=args.buckets,
        log=print,
    )
    world = run.params.world_ids()[0]
    updates = Updates(world, args.keys, args.updates, profile.seed, f"{run.unique}-upd")
    lat = Updates(world, args.keys, int(args.latency_rate * 10), profile.seed + 1, f"{run.unique}-lat", 10**6)

    async def go() -> dict[str, Any]:
        results = {}
        for name in profile.contenders:
            results[name] = await run.contender(name, updates, lat)  # type: ignore[arg-type]
            run.log(f"[{name}] {results[name]['events_per_s']} events/s, peak RSS {results[name]['peak_rss_mb']} MiB")
        return results

    started = time.monotonic()
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    results = asyncio.run(go())
    cw = results.get("causeway")
    if cw and run.seed and cw["bytes_ingested"]:
        since = max(0, cw["data_bytes_written"] - cw["live_bytes"] - (run.seed["data_bytes"] - run.seed["live_bytes"]))
        cw["rewrite_amplification_after_seed"] = round(since / cw["bytes_ingested"], 3)
        plan = run.plan("causeway")
        catalog = NessieCatalog.from_settings(plan.settings, plan.settings.main_branch, client=run.client)
        try:
            where = measure.warehouse_path(plan.warehouse)
            end = superseded(where, catalog, plan.settings.main_branch, run.base.namespace)
        except Exception as exc:  # noqa: BLE001 - the run's own figures still get saved
            run.log(f"[causeway] no per-table breakdown: {exc!r}")
        else:
            per_table = superseded_since(run.seed_tables, end)
            for row in per_table.values():
                for kind in KINDS:
                    row[f"{kind}_bytes_superseded_per_byte_ingested"] = round(
                        row[f"{kind}_bytes_superseded"] / cw["bytes_ingested"], 4
                    )
            cw["superseded_after_seed_by_table"] = per_table
            # What a read plans at the end: the live files per table (a flush of random keys reads
            # every projection partition's files).
            cw["live_files_at_end_by_table"] = {
                table: {k: row[k] for k in ("data_files_live", "deletes_files_live", "data_bytes_live")}
                for table, row in end.items()
            }
    doc = {
        "run": {
            "id": run.unique,
            "started": stamp,
            "seconds": round(time.monotonic() - started, 1),
            "command": " ".join(["python -m bench.keys_seeded", *sys.argv[1:]]),
            "profile": {k: v for k, v in vars(profile).items()},
            "workload": {"records": args.updates, "valid": args.updates, "bad": 0},
            "seed": run.seed | {"layout": args.layout, "buckets": args.buckets},
            "machine": machine(),
            "versions": versions(run.base),
            "work_dir": str(run.work),
        },
        "contenders": results,
        "ratios": ratios(results),
    }
    json_path, md_path = save(doc, args.out)
    print(markdown(doc))
    print(json.dumps({"seed": run.seed, "rewrite_after_seed": cw and cw.get("rewrite_amplification_after_seed")}))
    if cw:
        print(json.dumps(cw.get("superseded_after_seed_by_table"), indent=1))
    print(f"results: {json_path}\n         {md_path}")
    if not args.keep:
        print(f"removed what the run made (--keep keeps it): {asyncio.run(clean(run))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
