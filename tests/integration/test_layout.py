"""Table layouts against the real Nessie: pruning, bucket-local flushes, partition evolution, GC safety."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import StringType

from cli.main import cli
from models.events import ChangeEvent
from sinks.committer import BatchCommitter
from sinks.layout import DEFAULT_LAYOUTS, default_layouts, partition_spec
from sinks.layout_run import TableLayouts
from sinks.nessie import Reference, SyncNessieClient
from sinks.tables import ALL_TABLES, COMMON, EVENTS
from tests.integration.commits import batch, empty_root, obj, objects
from tests.integration.layout_helpers import (
    ReadRecorder,
    cat_of,
    legacy_tables,
    legacy_world_with_data,
    writes_reads_and_rebuild_after_evolution,
)

pytestmark = pytest.mark.integration


DAY_MS = 86_400_000
T0 = 1_700_006_400_000  # 2023-11-15T00:00:00Z


def new_world(client: SyncNessieClient) -> str:
    world_id = f"t{uuid.uuid4().hex[:10]}"
    client.create_branch(f"world-{world_id}", empty_root(client))
    return world_id


def bucket_of(pk: str, buckets: int) -> int:
    return BucketTransform(buckets).transform(StringType())(pk)


@pytest.mark.parametrize("buckets", [0, 4])
def test_new_tables_get_the_standard_layouts_and_gc_disabled(client, sink_settings, buckets: int) -> None:
    world = new_world(client)
    committer = BatchCommitter(sink_settings.replace(projection_buckets=buckets), client)
    committer.commit_batch(batch(world, "b1", [obj(world, "p1", "CREATE", 1)], 0))
    cat = cat_of(committer, world)
    standard = default_layouts(buckets)
    for tdef in ALL_TABLES:
        t = cat.load_table(("onto", tdef.name))
        assert t.properties["gc.enabled"] == "false"
        assert not t.spec().is_unpartitioned()
        assert [(f.name, str(f.transform)) for f in t.spec().fields] == [
            (f.name, str(f.transform)) for f in partition_spec(standard[tdef.name].spec, tdef.schema).fields
        ]
        assert [t.schema().find_column_name(f.source_id) for f in t.sort_order().fields] == list(
            standard[tdef.name].sort
        )


@pytest.mark.parametrize("buckets", [0, 4])
def test_a_rebuild_creates_a_missing_projection_with_the_configured_layout(client, sink_settings, buckets: int) -> None:
    """Failed before at both counts: the rebuild's overwrite created a missing projection with the
    module default's spec (type only, whatever ``projection_buckets`` said) and no sort order."""
    from datetime import UTC, datetime

    from sinks.overwrite import overwrite_tables

    world = new_world(client)
    settings = sink_settings.replace(projection_buckets=buckets)
    now = datetime.now(UTC)
    row = {
        "object_type_id": "person", "object_pk": "p1", "version": 1, "properties": "{}", "deleted": False,
        "updated_at": now, "committed_at": now, "event_id": "e1", "batch_id": "b1", "schema_version": 1,
    }  # fmt: skip
    overwrite_tables(
        settings,
        client,
        f"world-{world}",
        [(COMMON, [row])],
        message="rebuild of a world without a projection",
        properties={"causeway.test.rebuild": world},
        id_property="causeway.test.rebuild",
    )
    t = cat_of(BatchCommitter(settings, client), world).load_table(("onto", COMMON.name))
    standard = default_layouts(buckets)[COMMON.name]
    assert [(f.name, str(f.transform)) for f in t.spec().fields] == [
        (f.name, str(f.transform)) for f in partition_spec(standard.spec, COMMON.schema).fields
    ]
    assert [t.schema().find_column_name(f.source_id) for f in t.sort_order().fields] == list(standard.sort)
    assert t.scan().to_arrow().column("object_pk").to_pylist() == ["p1"]


@pytest.mark.parametrize("buckets", [0, 4])
def test_a_rebuild_writes_its_rows_in_the_table_sort_order(client, sink_settings, buckets: int) -> None:
    """The rebuild's overwrite wrote the rows in the order it was given them (the fold's), while the
    table is sorted by (type, key): each data file now holds its rows in that order."""
    from datetime import UTC, datetime

    from sinks.overwrite import overwrite_tables

    world = new_world(client)
    settings = sink_settings.replace(projection_buckets=buckets)
    now = datetime.now(UTC)
    keys = [(t, f"p{i:03d}") for i in range(60) for t in ("person", "account", "zone")]
    rows = [
        {
            "object_type_id": t, "object_pk": pk, "version": 1, "properties": "{}", "deleted": False,
            "updated_at": now, "committed_at": now, "event_id": f"e-{t}-{pk}", "batch_id": "b1", "schema_version": 1,
        }
        for t, pk in reversed(keys)
    ]  # fmt: skip
    overwrite_tables(
        settings,
        client,
        f"world-{world}",
        [(COMMON, rows)],
        message="rebuild with rows out of order",
        properties={"causeway.test.rebuild": world},
        id_property="causeway.test.rebuild",
    )
    table = cat_of(BatchCommitter(settings, client), world).load_table(("onto", COMMON.name))
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert len(files) == (3 if buckets == 0 else 12)
    for path in files:
        stored = pq.read_table(path.removeprefix("file://"), columns=["object_type_id", "object_pk"])
        pairs = list(zip(*(stored.column(c).to_pylist() for c in stored.column_names), strict=True))
        assert pairs == sorted(pairs), path
    assert sorted(table.scan().to_arrow().column("object_pk").to_pylist()) == sorted(pk for _, pk in keys)


def test_a_batch_touching_k_buckets_reads_and_rewrites_only_those(client, sink_settings) -> None:
    n = 16  # 2 of 16 buckets, whatever the default count (the test is about buckets)
    world = new_world(client)
    committer = BatchCommitter(sink_settings.replace(projection_buckets=n), client)
    pks = [f"p-{i:04d}" for i in range(600)]
    committer.commit_batch(batch(world, "seed", [obj(world, pk, "CREATE", 1, n=0) for pk in pks], 0))
    table = cat_of(committer, world).load_table(("onto", COMMON.name))
    files_per_bucket: dict[int, set[str]] = {}
    for task in table.scan().plan_files():
        files_per_bucket.setdefault(task.file.partition[1], set()).add(task.file.file_path)
    assert len(files_per_bucket) == n  # 600 keys reach every bucket

    touched_buckets = sorted(files_per_bucket)[:2]
    chosen = [pk for pk in pks if bucket_of(pk, n) in touched_buckets][:40]
    assert {bucket_of(pk, n) for pk in chosen} == set(touched_buckets)
    reads = ReadRecorder(committer)
    out = committer.commit_batch(batch(world, "upd", [obj(world, pk, "UPDATE", 2, n=1) for pk in chosen], 1000))

    allowed = set().union(*(files_per_bucket[b] for b in touched_buckets))
    data_reads = [p for p in reads.paths if "/data/" in p and "delete-" not in p]
    assert data_reads, "the flush must read the touched buckets' key columns"
    assert set(data_reads) <= allowed, "a flush read a data file of a bucket it did not touch"
    all_files = set().union(*files_per_bucket.values())
    assert len(set(data_reads)) <= len(all_files) * 2 / n

    # What the commit wrote and removed lies in the touched buckets only.
    after = cat_of(committer, world).load_table(("onto", COMMON.name))
    snap = after.current_snapshot()
    assert snap is not None and snap.snapshot_id != table.current_snapshot().snapshot_id
    changed = [
        e.data_file
        for m in snap.manifests(after.io)
        for e in m.fetch_manifest_entry(after.io, discard_deleted=False)
        if e.snapshot_id == snap.snapshot_id
    ]
    assert changed and {df.partition[1] for df in changed} <= set(touched_buckets)
    assert out.stats[COMMON.name].rows_deleted == len(chosen)
    rows = objects(cat_of(committer, world))
    assert len(rows) == len(pks)
    assert all(rows[pk][0] == (2 if pk in chosen else 1) for pk in pks)


def test_a_batch_touching_k_type_bucket_pairs_reads_only_those_partitions(client, sink_settings) -> None:
    # Two types over the same 8 buckets: a flush of keys of one type in a bucket must not read
    # the other type's files of that bucket (pruning by bucket alone reads 2 partitions per key).
    n = 8
    world = new_world(client)
    committer = BatchCommitter(sink_settings.replace(projection_buckets=n), client)
    pks = {typ: [f"{typ[:2]}-{i:04d}" for i in range(200)] for typ in ("person", "place")}
    seed = [obj(world, pk, "CREATE", 1, typ, n=0) for typ, keys in pks.items() for pk in keys]
    committer.commit_batch(batch(world, "seed", seed, 0))
    table = cat_of(committer, world).load_table(("onto", COMMON.name))
    files: dict[tuple[str, int], set[str]] = {}
    for task in table.scan().plan_files():
        files.setdefault((task.file.partition[0], task.file.partition[1]), set()).add(task.file.file_path)
    assert len(files) == 2 * n  # 200 keys of each type reach every bucket

    # k = 3 pairs: person in buckets b0 and b1, place in b2 (three different buckets).
    b0, b1, b2 = range(3)
    chosen = {
        "person": [pk for pk in pks["person"] if bucket_of(pk, n) in (b0, b1)][:10],
        "place": [pk for pk in pks["place"] if bucket_of(pk, n) == b2][:5],
    }
    touched = {(typ, bucket_of(pk, n)) for typ, keys in chosen.items() for pk in keys}
    assert touched == {("person", b0), ("person", b1), ("place", b2)}
    reads = ReadRecorder(committer)
    upd = [obj(world, pk, "UPDATE", 2, typ, n=1) for typ, keys in chosen.items() for pk in keys]
    committer.commit_batch(batch(world, "upd", upd, 1000))

    data_reads = {p for p in reads.paths if "/data/" in p and "delete-" not in p}
    allowed = set().union(*(files[pair] for pair in touched))
    assert data_reads == allowed, (
        f"read {len(data_reads)} data files, the {len(touched)} touched partitions hold {len(allowed)}"
    )
    rows = objects(cat_of(committer, world))
    updated = {pk for keys in chosen.values() for pk in keys}
    assert len(rows) == 400
    assert all(rows[pk][0] == (2 if pk in updated else 1) for keys in pks.values() for pk in keys)


def test_audit_trail_and_time_window_reads_prune_the_log(client, sink_settings) -> None:
    # A small target file size stands in for a large log: each flush's file is a fraction of the
    # target (as 10k-event flushes are of 64 MiB), so compaction merges a day's flush files and
    # cuts the sorted result into several files with disjoint key ranges.
    settings = sink_settings.replace(target_file_bytes=192 * 1024)
    world = new_world(client)
    committer = BatchCommitter(settings, client)
    versions: dict[str, int] = {}
    expected: dict[str, int] = {}
    for b in range(24):
        evs: list[ChangeEvent] = []
        for i in range(120):
            pk = f"p-{(b * 37 + i * 11) % 400:04d}"
            versions[pk] = versions.get(pk, 0) + 1
            ev = obj(world, pk, "CREATE" if versions[pk] == 1 else "UPDATE", versions[pk], n=i, pad="x" * 200)
            evs.append(replace(ev, occurred_at_ms=T0 + (b % 3) * DAY_MS + i * 1000))
            expected[pk] = expected.get(pk, 0) + 1
        committer.commit_batch(batch(world, f"b{b}", evs, b * 1000))
    log = cat_of(committer, world).load_table(("onto", EVENTS.name))
    total = list(log.scan().plan_files())
    assert 6 <= len(total) < 24, f"compaction should leave a few sorted files per day, got {len(total)}"

    pk = "p-0123"
    trail = log.scan(row_filter=And(EqualTo("entity_type", "person"), EqualTo("entity_pk", pk)))
    read = list(trail.plan_files())
    assert len(read) <= len(total) / 2, f"audit trail read {len(read)} of {len(total)} files"
    rows = trail.to_arrow()
    assert rows.num_rows == expected[pk]
    assert sorted(rows.column("version").to_pylist()) == list(range(1, expected[pk] + 1))

    window = log.scan(
        row_filter=And(
            GreaterThanOrEqual("occurred_at", "2023-11-16T00:00:00+00:00"),
            LessThan("occurred_at", "2023-11-17T00:00:00+00:00"),
        )
    )
    in_window = list(window.plan_files())
    assert len(in_window) <= len(total) / 2
    assert window.to_arrow().num_rows == sum(120 for b in range(24) if b % 3 == 1)


def test_evolution_on_a_world_with_data_keeps_reads_projections_and_rebuild(client, sink_settings) -> None:
    world = new_world(client)
    committer = BatchCommitter(sink_settings, client)
    first, before = legacy_world_with_data(committer, world)

    layouts = TableLayouts(sink_settings, committer)
    dry = layouts.evolve(world, COMMON.name, DEFAULT_LAYOUTS[COMMON.name].spec, None, dry_run=True)
    assert dry.dry_run and dry.commit is None and dry.evolution.spec_changed
    assert cat_of(committer, world).load_table(("onto", COMMON.name)).spec().is_unpartitioned()

    for tdef in ALL_TABLES:
        layout = DEFAULT_LAYOUTS[tdef.name]
        head = client.get_reference(f"world-{world}").hash
        res = layouts.evolve(world, tdef.name, layout.spec, layout.sort)
        assert res.commit is not None and res.base == head
        assert res.properties_set == {"gc.enabled": "false"}
        again = layouts.evolve(world, tdef.name, layout.spec, layout.sort)
        assert not again.changed and again.commit is None
    cat = cat_of(committer, world)
    common = cat.load_table(("onto", COMMON.name))
    assert len(common.specs()) == 2 and not common.spec().is_unpartitioned()
    assert objects(cat) == before, "evolution changed what readers see"

    writes_reads_and_rebuild_after_evolution(sink_settings, committer, world, first, before)


def test_evolution_back_to_unpartitioned_and_unsorted_then_writes(client, sink_settings) -> None:
    """``--spec none --sort none`` on tables with the default layout: the sort order went through
    pyiceberg's builder, which failed with ValueError ("no sort order has been added") since the
    unsorted order exists in every table already; found by the keys-axis A/B (bench.keys_seeded)."""
    world = new_world(client)
    committer = BatchCommitter(sink_settings, client)
    first = [obj(world, f"p{i}", "CREATE", 1, n=i) for i in range(30)]
    committer.commit_batch(batch(world, "before", first, 0))
    before = objects(cat_of(committer, world))
    layouts = TableLayouts(sink_settings, committer)
    for tdef in ALL_TABLES:
        res = layouts.evolve_text(world, tdef.name, "none", "none")
        assert res.changed and res.commit is not None
        assert not layouts.evolve_text(world, tdef.name, "none", "none").changed
    cat = cat_of(committer, world)
    for tdef in ALL_TABLES:
        table = cat.load_table(("onto", tdef.name))
        assert table.spec().is_unpartitioned() and table.sort_order().is_unsorted
    assert objects(cat) == before
    committer.commit_batch(batch(world, "after", [obj(world, "p0", "UPDATE", 2, n=0)], 30))
    after = objects(cat_of(committer, world))
    assert len(after) == len(before) and after != before


def test_evolution_from_a_partitioned_spec_then_deletes_against_old_spec_files(
    client, sink_settings, monkeypatch
) -> None:
    """Type-only projections (``projection_buckets`` = 0) evolved to type + bucket, the log from day to
    month: the next flush writes position deletes for files of the old, one-field spec. pyiceberg's
    snapshot summary labelled every added file with the new two-field spec and the flush failed
    (IndexError in ``partition_to_path``), found by the Spark read check (``bench/spark_read.py``)."""
    world = new_world(client)
    committer = BatchCommitter(sink_settings.replace(projection_buckets=0), client)
    people = [obj(world, f"p{i}", "CREATE", 1, n=i) for i in range(60)]
    places = [obj(world, f"q{i}", "CREATE", 1, typ="place", n=i) for i in range(20)]
    # One type per flush: a small flush of both would be one file under the unpartitioned spec
    # (``sinks.layout.writes_one_file``), and this test needs files of the one-field spec.
    committer.commit_batch(batch(world, "before", people, 0))
    committer.commit_batch(batch(world, "before-places", places, len(people)))
    first = people + places
    before = objects(cat_of(committer, world))
    assert len(cat_of(committer, world).load_table(("onto", COMMON.name)).spec().fields) == 1

    # "default" with 4 buckets, whatever the default count: the evolution is from type only to type + bucket
    layouts = TableLayouts(sink_settings.replace(projection_buckets=4), committer)
    for tdef in (COMMON, EVENTS):
        spec = "month(occurred_at)" if tdef is EVENTS else "default"
        assert layouts.evolve_text(world, tdef.name, spec, None).changed
    common = cat_of(committer, world).load_table(("onto", COMMON.name))
    assert [len(s.fields) for s in common.specs().values()] == [1, 2]

    writes_reads_and_rebuild_after_evolution(sink_settings, committer, world, first, before)
    common = cat_of(committer, world).load_table(("onto", COMMON.name))
    deletes = {d.spec_id for t in common.scan().plan_files() for d in t.delete_files}
    assert 0 in deletes, "the old-spec files' position deletes keep the old spec"
    summary = common.current_snapshot().summary  # type: ignore[union-attr]
    assert int(summary["total-position-deletes"]) > 0

    # `causeway tables show` on the evolved world: spec history, sort order, snapshots, and file, row
    # and delete-file counts per partition of either spec.
    import orjson

    monkeypatch.setenv("CAUSEWAY_WAREHOUSE", sink_settings.warehouse)
    monkeypatch.setenv("CAUSEWAY_PROJECTION_BUCKETS", "4")
    shown = CliRunner().invoke(cli, ["tables", "show", world, COMMON.name, "--json"])
    assert shown.exit_code == 0, shown.output
    report = orjson.loads(shown.output)
    assert [(s["spec"], s["default"]) for s in report["specs"]] == [
        ("identity(object_type_id)", False),
        ("identity(object_type_id), bucket(4, object_pk)", True),
    ]
    assert report["sort_order"] == "object_type_id, object_pk"
    assert report["snapshots"] == len(common.metadata.snapshots)
    tasks = list(common.scan().plan_files())
    parts = report["partitions"]
    assert {p["spec_id"] for p in parts} == {0, 1}
    assert report["data_files"] == sum(p["data_files"] for p in parts) == len(tasks)
    assert report["rows"] == sum(p["rows"] for p in parts) == sum(t.file.record_count for t in tasks)
    assert report["delete_files"] == len({d.file_path for t in tasks for d in t.delete_files}) > 0
    assert any(p["spec_id"] == 0 and p["delete_files"] for p in parts), "deletes against old-spec files"
    text = CliRunner().invoke(cli, ["tables", "show", world, COMMON.name])
    assert "spec 1: identity(object_type_id), bucket(4, object_pk)  (current)" in text.output
    assert "object_type_id=person/object_pk_bucket_4=" in text.output and "object_type_id=person " in text.output


def test_expiry_never_deletes_a_file_another_branch_references(client, sink_settings) -> None:
    settings = sink_settings.replace(snapshot_expire_every=3)
    world = new_world(client)
    committer = BatchCommitter(settings, client)
    for b in range(3):
        evs = [obj(world, f"p{i}", "CREATE" if b == 0 else "UPDATE", b + 1, n=b) for i in range(50)]
        committer.commit_batch(batch(world, f"a{b}", evs, b * 100))
    fork = f"world-{world}-fork"
    client.create_branch(fork, Reference(f"world-{world}", "BRANCH", client.get_reference(f"world-{world}").hash))
    forked = committer.catalog(fork)
    shared: dict[str, set[str]] = {}
    for tdef in ALL_TABLES:
        assert forked.load_table(("onto", tdef.name)).properties["gc.enabled"] == "false"
    for tdef in (EVENTS, COMMON):  # the tables this world writes (no links)
        t = forked.load_table(("onto", tdef.name))
        snaps = {s.snapshot_id for s in t.metadata.snapshots}
        assert len(snaps) >= 2
        files = {task.file.file_path for task in t.scan().plan_files()}
        files |= {d.file_path for task in t.scan().plan_files() for d in task.delete_files}
        files |= {m.manifest_path for s in t.metadata.snapshots for m in s.manifests(t.io)}
        shared[tdef.name] = files
    expected = objects(forked)

    # The original branch moves on: updates, compaction and snapshot expiry on every commit.
    for b in range(3, 12):
        evs = [obj(world, f"p{i}", "UPDATE", b + 1, n=b) for i in range(50)]
        committer.commit_batch(batch(world, f"a{b}", evs, b * 100))
    moved = cat_of(committer, world).load_table(("onto", COMMON.name))
    assert len(moved.metadata.snapshots) <= 4, "expiry did not run on the original branch"
    gone_there = shared[COMMON.name] - {task.file.file_path for task in moved.scan().plan_files()}
    assert gone_there, "the original branch should no longer reference some of the fork's files"

    forked = committer.catalog(fork)
    for tdef in (EVENTS, COMMON):
        t = forked.load_table(("onto", tdef.name))
        for path in shared[tdef.name]:
            assert t.io.new_input(path).exists(), f"{path} was deleted while {fork} references it"
        for s in t.metadata.snapshots:  # every snapshot the fork still has stays readable
            assert isinstance(t.scan(snapshot_id=s.snapshot_id).to_arrow(), pa.Table)
    assert objects(forked) == expected


def test_cli_show_and_evolve(client, sink_settings, monkeypatch) -> None:
    world = new_world(client)
    committer = BatchCommitter(sink_settings, client)
    legacy_tables(committer, world)
    committer.commit_batch(batch(world, "b1", [obj(world, f"p{i}", "CREATE", 1) for i in range(20)], 0))
    monkeypatch.setenv("CAUSEWAY_WAREHOUSE", sink_settings.warehouse)
    monkeypatch.setenv("CAUSEWAY_PROJECTION_BUCKETS", "4")  # "--spec default" below: 4 buckets, whatever the default
    runner = CliRunner()

    help_ = runner.invoke(cli, ["tables", "evolve", "--help"])
    assert help_.exit_code == 0 and "Example" in help_.output

    dry = runner.invoke(cli, ["tables", "evolve", world, "entity_common", "--spec", "default", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "none  ->  identity(object_type_id), bucket(4, object_pk)" in dry.output
    assert "dry run" in dry.output

    every = runner.invoke(
        cli, ["tables", "evolve", world, "all", "--spec", "default", "--sort", "default", "--dry-run"]
    )
    assert every.exit_code == 0, every.output
    assert every.output.count("dry run: nothing committed") == 3 and "add column batch_seq" in every.output

    done = runner.invoke(cli, ["tables", "evolve", world, "entity_common", "--spec", "default", "--sort", "default"])
    assert done.exit_code == 0 and "committed" in done.output, done.output

    shown = runner.invoke(cli, ["tables", "show", world, "entity_common"])
    assert shown.exit_code == 0, shown.output
    assert (
        "spec 0: none" in shown.output
        and "spec 1: identity(object_type_id), bucket(4, object_pk)  (current)" in shown.output
    )
    assert "gc.enabled: false" in shown.output and "(unpartitioned)" in shown.output

    import orjson

    js = runner.invoke(cli, ["tables", "show", world, "entity_common", "--json"])
    report = orjson.loads(js.output)
    assert report["rows"] == 20 and report["data_files"] == 1 and report["snapshots"] >= 1
    assert [s["default"] for s in report["specs"]] == [False, True]

    for args, needle in (
        (["tables", "show", "no-such-world-x"], "has no branch"),
        (["tables", "show", world, "nope"], "unknown table"),
        (["tables", "evolve", world, "entity_common", "--spec", "bucket(x, object_pk)"], "positive number"),
        (["tables", "evolve", world, "entity_common", "--spec", "day(nope)"], "no column 'nope'"),
    ):
        r = runner.invoke(cli, args)
        assert r.exit_code != 0 and needle in r.output, r.output
        assert "Traceback" not in r.output


def test_a_flush_never_loses_deletes_of_a_file_it_does_not_touch(client, sink_settings) -> None:
    """Deletes of one partition are merged with every data file of that partition in view.

    Keys of one bucket land in several files; a delete file then names two of them. A later flush
    touching keys of only one file merges delete files (max_delete_files=1): had the flush pruned
    the other file by min/max statistics, its deleted rows would have come back.
    """
    world = new_world(client)
    n = 4  # keys of one bucket of 4, whatever the default count
    settings = sink_settings.replace(projection_buckets=n)
    committer = BatchCommitter(settings, client, max_delete_files=1, compact_below=0.0)
    same = [pk for pk in (f"k{i:05d}" for i in range(3000)) if bucket_of(pk, n) == 3]
    low, high = same[:20], same[-20:]
    committer.commit_batch(batch(world, "low", [obj(world, pk, "CREATE", 1) for pk in low], 0))
    committer.commit_batch(batch(world, "high", [obj(world, pk, "CREATE", 1) for pk in high], 100))
    both = [obj(world, low[0], "UPDATE", 2), obj(world, high[0], "UPDATE", 2)]
    committer.commit_batch(batch(world, "both", both, 200))
    for n, pk in enumerate(low[1:4]):
        committer.commit_batch(batch(world, f"only-low-{n}", [obj(world, pk, "UPDATE", 2)], 300 + n))
    rows = objects(cat_of(committer, world))  # raises on a duplicate live row
    assert rows[high[0]][0] == 2 and rows[low[0]][0] == 2
    assert len(rows) == len(low) + len(high)


def test_show_counts_only_deletes_of_live_files(client, sink_settings) -> None:
    """A merged delete file can name a data file that compaction removed later; ``tables show``
    counts deleted rows of live files only, so rows - deleted rows is what a scan returns."""
    world = new_world(client)
    committer = BatchCommitter(sink_settings.replace(projection_buckets=0), client)
    committer.commit_batch(batch(world, "a", [obj(world, f"a{i}", "CREATE", 1) for i in range(100)], 0))
    committer.commit_batch(batch(world, "b", [obj(world, f"b{i}", "CREATE", 1) for i in range(100)], 100))
    # one delete file naming both files; then the first file passes half deleted and is compacted
    first = [obj(world, f"a{i}", "UPDATE", 2) for i in range(40)] + [obj(world, "b0", "UPDATE", 2)]
    committer.commit_batch(batch(world, "a40", first, 200))
    committer.commit_batch(batch(world, "a60", [obj(world, f"a{i}", "UPDATE", 2) for i in range(40, 60)], 300))
    table = cat_of(committer, world).load_table(("onto", COMMON.name))
    tasks = list(table.scan().plan_files())
    live = {t.file.file_path for t in tasks}
    named: set[str] = set()
    for path in {d.file_path for t in tasks for d in t.delete_files}:
        with table.io.new_input(path).open() as f:
            named |= set(pq.read_table(f, columns=["file_path"]).column("file_path").to_pylist())
    assert named - live, "the setup should leave a delete file naming a removed data file"

    report = TableLayouts(sink_settings, committer).show(world, [COMMON.name])[0]
    assert report.rows - report.deleted_rows == table.scan().to_arrow().num_rows == 200
