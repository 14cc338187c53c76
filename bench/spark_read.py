"""Another engine reads causeway's tables: Spark (Iceberg's Nessie catalog) against pyiceberg.

Two halves, run in two environments (pyspark is not a causeway dependency)::

    # 1. the project's venv: write two worlds on fresh Nessie branches, digest them with pyiceberg
    python -m bench.spark_read write --out /tmp/spark-read.json
    # 2. a venv with pyspark 3.5 and Java 17: read the same tables with Spark, compare
    SPARK_PY=/path/to/venv/bin/python
    $SPARK_PY bench/spark_read.py read /tmp/spark-read.json --jar iceberg-spark-runtime-3.5_2.12-1.10.0.jar

World ``a`` is written with the current default layouts (``day(occurred_at)``; type and
``bucket(CAUSEWAY_PROJECTION_BUCKETS, pk)``); world ``b`` starts with the projections partitioned by
type only (``CAUSEWAY_PROJECTION_BUCKETS=0``), is moved with ``causeway tables evolve`` (projections
to the default spec, the log to ``month(occurred_at)``) and written again (new keys 40 days later,
and updates and deletes of a few old rows), so its tables hold files of two specs and position
deletes against old-spec files. For each (branch, table) both engines give the
row count and a digest of every non-timestamp column and of the rows (timestamps are left out:
engines render zones differently); ``read`` exits 1 if any differs.

``write --cross-spec-delete`` adds world ``c``, a probe of one reader rule rather than of
causeway's writes: type-only projections written one type a flush (so every data file is under
the type spec), then ONE position-delete file under the table's unpartitioned spec naming the
first row of every type's files. The Iceberg spec applies a position-delete file only to data files
of its own spec and partition (the "or the delete file's partition spec is unpartitioned" clause
is the equality deletes' rule), so a conforming reader ignores it; ``read`` says whether Spark
applied it, ``write`` whether pyiceberg and causeway's own planning did (docs/architecture.md,
"Table layout": why a small flush's position deletes stay one file per partition).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

TABLES = ("entity_events", "entity_common", "entity_edge")
TIMESTAMPS = {"occurred_at", "committed_at", "updated_at"}


def _canon(value: Any) -> str:
    if value is None:
        return "\u2205"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def digest(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Row count, a sha256 per non-timestamp column (its sorted values) and one over the sorted rows."""
    keep = [c for c in columns if c not in TIMESTAMPS]
    per_col: dict[str, list[str]] = {c: [] for c in keep}
    lines: list[str] = []
    for row in rows:
        vals = [_canon(row[c]) for c in keep]
        for c, v in zip(keep, vals, strict=True):
            per_col[c].append(v)
        lines.append("\x1f".join(vals))

    def h(items: list[str]) -> str:
        return hashlib.sha256("\x1e".join(sorted(items)).encode()).hexdigest()[:16]

    return {"rows": len(lines), "columns": {c: h(v) for c, v in per_col.items()}, "row_digest": h(lines)}


# --- write (the project's venv) -------------------------------------------------------------------


def _events(world: str, seed: int, count: int, keys: int, days: int, prefix: str = "", day0: int = 0) -> list[Any]:
    """``count`` valid events of the demo workload for ``world``, spread over ``days`` days from ``day0``."""
    from cli.workload import BASE_TIME_MS, WorkloadParams, generate

    params = WorkloadParams(
        events=count, worlds=1, keys=keys, seed=seed, duplicate_rate=0, bad_rate=0, id_prefix=f"{world}-{prefix}"
    )
    evs = generate(replace(params, pk_prefix=prefix)).valid_events
    step = days * 86_400_000 // max(1, len(evs))
    t0 = BASE_TIME_MS + day0 * 86_400_000
    return [replace(e, world_id=world, occurred_at_ms=t0 + i * step) for i, e in enumerate(evs)]


def _touch(evs: list[Any], updates: int, deletes: int) -> list[Any]:
    """Updates and deletes of a few objects ``evs`` left alive: position deletes against their files."""
    from models.events import ChangeType, EntityKind

    last: dict[str, Any] = {}
    for e in evs:
        if e.kind is EntityKind.OBJECT:
            last[e.entity_pk] = e
    alive = [e for e in last.values() if e.change_type is not ChangeType.DELETE][: updates + deletes]
    out = []
    for i, e in enumerate(alive):
        change = ChangeType.UPDATE if i < updates else ChangeType.DELETE
        after = {"name": e.entity_pk, "status": "touched"} if change is ChangeType.UPDATE else None
        out.append(
            replace(
                e, event_id=f"{e.event_id}-t", change_type=change, version=e.version + 1, after=after, caused_by=None
            )
        )
    return out


def _commit(committer: Any, world: str, evs: list[Any], flush: int, first_offset: int) -> None:
    from models.events import EntityKind
    from sinks.committer import Batch, Source

    for start in range(0, len(evs), flush):
        chunk = evs[start : start + flush]
        items = [
            (
                e,
                Source(
                    "onto.changes.links" if e.kind is EntityKind.LINK else "onto.changes.objects",
                    0,
                    first_offset + start + i,
                ),
            )
            for i, e in enumerate(chunk)
        ]
        committer.commit_batch(Batch.from_sources(world, f"spark-{first_offset + start}", items))


def _pyiceberg_side(committer: Any, branch: str, namespace: str) -> dict[str, Any]:
    cat = committer.catalog(branch)
    out: dict[str, Any] = {}
    for name in TABLES:
        table = cat.load_table((namespace, name))
        arrow = table.scan().to_arrow()
        tasks = list(table.scan().plan_files())
        deletes = {d.file_path for t in tasks for d in t.delete_files}
        out[name] = digest(arrow.column_names, arrow.to_pylist()) | {
            "data_files": len(tasks),
            "delete_files": len(deletes),
            "specs_in_use": sorted({t.file.spec_id for t in tasks}),
            "spec": str(table.spec()),
        }
    return out


def _evolve(world: str, env: dict[str, str], args: list[str]) -> str:
    cmd = [sys.executable, "-m", "cli.main", "tables", "evolve", world, *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:])} failed: {done.stdout}{done.stderr}")
    return done.stdout


def _cross_spec_delete(settings: Any, client: Any, world: str, events: int) -> dict[str, Any]:
    """World ``c``: every data file under the type spec, then one position-delete file under the
    unpartitioned spec over all of them. What pyiceberg's scan and ``plan_live_files`` make of it."""
    import pyarrow.parquet as pq
    from pyiceberg.table.update import AddPartitionSpecUpdate
    from pyiceberg.typedef import Record

    from models.events import EntityKind
    from sinks.committer import BatchCommitter
    from sinks.layout import unpartitioned_spec
    from sinks.rowdelta import RowDelta, new_delete_location, plan_live_files, write_position_deletes

    committer = BatchCommitter(settings, client)
    evs = _events(world, 14, events // 2, events // 10, 3)
    groups: dict[str, list[Any]] = {}
    for e in evs:  # one flush per object type (and one of links): one partition each, never one file
        groups.setdefault("" if e.kind is EntityKind.LINK else e.entity_type, []).append(e)
    offset = 0
    for group in groups.values():
        _commit(committer, world, group, len(group), offset)
        offset += len(group)
    cat = committer.catalog(f"world-{world}")
    table = cat.load_table((settings.namespace, "entity_common"))
    files = [t.file for t in plan_live_files(table)]
    named: dict[str, Iterable[int] | Any] = {}
    gone: set[tuple[str, int]] = set()
    for df in files:
        with table.io.new_input(df.file_path).open() as f:
            first = pq.read_table(f, columns=["object_type_id", "object_pk"]).slice(0, 1).to_pylist()[0]
        named[df.file_path] = [0]
        gone.add((first["object_type_id"], first["object_pk"]))
    before = table.scan().to_arrow()
    cat.begin()
    table = cat.load_table((settings.namespace, "entity_common"))
    tx = table.transaction()
    one = unpartitioned_spec(tx.table_metadata.specs())
    if one.spec_id not in tx.table_metadata.specs():
        tx._apply((AddPartitionSpecUpdate(spec=one),))
    delete = write_position_deletes(table.io, new_delete_location(table), named, one.spec_id, Record())
    assert delete is not None
    RowDelta(tx, {"causeway.batch_id": "cross-spec-delete"}).add([delete]).commit()
    tx.commit_transaction()
    cat.publish("bench.spark_read: one position-delete file under the unpartitioned spec")
    table = cat.load_table((settings.namespace, "entity_common"))
    rows = table.scan().to_arrow()
    kept = [r for r in before.to_pylist() if (r["object_type_id"], r["object_pk"]) not in gone]
    return {
        "data_files": [(df.spec_id, str(df.partition)) for df in files],
        "delete_file_spec": one.spec_id,
        "rows_before": before.num_rows,
        "rows_if_applied": len(kept),
        "if_applied": digest(before.column_names, kept),
        "pyiceberg_rows": rows.num_rows,
        "pyiceberg_applies": rows.num_rows == len(kept),
        "pyiceberg_plan_deletes_per_file": [len(t.delete_files) for t in table.scan().plan_files()],
        "causeway_plan_deletes_per_file": [len(t.delete_files) for t in plan_live_files(table)],
    }


def write(out: Path, warehouse: str | None, events: int, cross_spec_delete: bool = False) -> int:
    from sinks.committer import BatchCommitter
    from sinks.nessie import Reference, SyncNessieClient
    from streams.settings import Settings

    base = Settings.from_env()
    warehouse = warehouse or f"file://{tempfile.mkdtemp(prefix='causeway-spark-read-')}/warehouse"
    settings = base.replace(warehouse=warehouse)
    client = SyncNessieClient.from_settings(settings)
    root = Reference("main", "BRANCH", client.config().no_ancestor_hash)
    tag = f"sr{int(time.time()) % 10**8}"
    worlds = {"a": f"{tag}a", "b": f"{tag}b"}
    report: dict[str, Any] = {
        "nessie_uri": settings.nessie_url.reveal(),
        "warehouse": warehouse,
        "namespace": settings.namespace,
        "projection_buckets": settings.projection_buckets,
        "worlds": {},
    }
    # a: the current defaults, 12 flushes (compaction and position deletes happen)
    world = worlds["a"]
    client.create_branch(f"world-{world}", root)
    committer = BatchCommitter(settings, client)
    _commit(committer, world, _events(world, 11, events, events // 5, 5), max(1, events // 12), 0)
    report["worlds"]["a"] = {"world": world, "branch": f"world-{world}", "evolved": []}

    # b: type-only projections, then evolved (projections to the default, the log to month), written again
    world = worlds["b"]
    client.create_branch(f"world-{world}", root)
    legacy = BatchCommitter(settings.replace(projection_buckets=0), client)
    evs = _events(world, 12, events // 2, events // 10, 3)
    _commit(legacy, world, evs, max(1, len(evs) // 6), 0)
    env = os.environ | {"CAUSEWAY_WAREHOUSE": warehouse, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    evolved = [
        _evolve(world, env, ["all", "--spec", "default", "--sort", "default"]),
        _evolve(world, env, ["entity_events", "--spec", "month(occurred_at)"]),
    ]
    # New keys (the new spec) and a few updates and deletes of old-spec rows (deletes against old files)
    later = _events(world, 13, events // 2, events // 10, 3, prefix="n", day0=40) + _touch(evs, 10, 5)
    _commit(BatchCommitter(settings, client), world, later, max(1, len(later) // 6), len(evs))
    report["worlds"]["b"] = {"world": world, "branch": f"world-{world}", "evolved": evolved}

    if cross_spec_delete:
        world = f"{tag}c"
        client.create_branch(f"world-{world}", root)
        report["worlds"]["c"] = {"world": world, "branch": f"world-{world}", "evolved": []}
        report["cross_spec_delete"] = _cross_spec_delete(settings.replace(projection_buckets=0), client, world, events)
    for w in report["worlds"].values():
        w["pyiceberg"] = _pyiceberg_side(committer, w["branch"], settings.namespace)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


# --- read (a venv with pyspark; imports nothing of causeway) --------------------------------------


def read(path: Path, jar: str) -> int:
    from pyspark.sql import SparkSession

    report = json.loads(path.read_text())
    builder = SparkSession.builder.appName("causeway-spark-read").master("local[1]")
    conf = {
        "spark.jars": jar,
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.showConsoleProgress": "false",
    }
    for key, w in report["worlds"].items():
        cat = f"spark.sql.catalog.cw{key}"
        conf |= {
            cat: "org.apache.iceberg.spark.SparkCatalog",
            f"{cat}.catalog-impl": "org.apache.iceberg.nessie.NessieCatalog",
            f"{cat}.uri": report["nessie_uri"],
            f"{cat}.client-api-version": "2",
            f"{cat}.ref": w["branch"],
            f"{cat}.warehouse": report["warehouse"],
        }
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print("spark", spark.version, json.dumps({k: v for k, v in conf.items() if k != "spark.jars"}, indent=2))
    failures = 0
    for key, w in report["worlds"].items():
        for name in TABLES:
            ident = f"cw{key}.{report['namespace']}.{name}"
            df = spark.table(ident)
            seen = digest(df.columns, (r.asDict() for r in df.toLocalIterator()))
            files = spark.sql(f"SELECT content, spec_id, count(*) AS n FROM {ident}.files GROUP BY 1, 2").collect()
            mine = w["pyiceberg"][name]
            same = seen["rows"] == mine["rows"] and seen["columns"] == mine["columns"]
            same = same and seen["row_digest"] == mine["row_digest"]
            failures += not same
            print(
                f"{w['branch']} {name}: spark {seen['rows']} rows, pyiceberg {mine['rows']} rows, "
                f"{len(seen['columns'])} columns digested, {'SAME' if same else 'DIFFERENT'}; "
                f"files (content, spec, n) {sorted((f.content, f.spec_id, f.n) for f in files)}; "
                f"pyiceberg: {mine['data_files']} data, {mine['delete_files']} delete files, "
                f"specs {mine['specs_in_use']}"
            )
            if not same:
                print("  spark    ", json.dumps(seen))
                print("  pyiceberg", json.dumps({k: mine[k] for k in ("rows", "columns", "row_digest")}))
    probe = report.get("cross_spec_delete")
    if probe:
        ident = f"cwc.{report['namespace']}.entity_common"
        df = spark.table(ident)
        seen = digest(df.columns, (r.asDict() for r in df.toLocalIterator()))
        applied = seen["row_digest"] == probe["if_applied"]["row_digest"]
        print(
            f"cross-spec delete: spark {seen['rows']} rows, {probe['rows_if_applied']} if the unpartitioned-spec "
            f"delete file applied, {probe['rows_before']} if not: Spark {'APPLIES' if applied else 'IGNORES'} it; "
            f"pyiceberg {'APPLIES' if probe['pyiceberg_applies'] else 'IGNORES'} it ({probe['pyiceberg_rows']} rows)"
        )
    spark.stop()
    print("ALL SAME" if not failures else f"{failures} table(s) differ")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write two worlds and digest them with pyiceberg (the project's venv)")
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--warehouse", help="file:// warehouse (default: a new temporary folder)")
    w.add_argument("--events", type=int, default=2_400, help="events per world (default 2,400)")
    w.add_argument(
        "--cross-spec-delete",
        action="store_true",
        help="add world c: one position-delete file under the unpartitioned spec over type-spec files",
    )
    r = sub.add_parser("read", help="read them with Spark and compare (a venv with pyspark)")
    r.add_argument("report", type=Path)
    r.add_argument("--jar", required=True, help="iceberg-spark-runtime-3.5_2.12 jar")
    args = ap.parse_args(argv)
    if args.cmd == "write":
        return write(args.out, args.warehouse, args.events, args.cross_spec_delete)
    return read(args.report, args.jar)


if __name__ == "__main__":
    sys.exit(main())
