"""A small projection flush on a type-partitioned table writes one file under the unpartitioned spec,
and the small-file merge moves its rows into their type partitions (issue 21, rewrite amplification;
``sinks.layout.writes_one_file``)."""

from __future__ import annotations

import uuid
from collections import Counter

import orjson
from click.testing import CliRunner
from pyiceberg.expressions import EqualTo

from cli.main import cli
from ops.rebuild.run import rebuild
from sinks.committer import BatchCommitter
from sinks.nessie import SyncNessieClient
from sinks.tables import COMMON
from tests.integration.commits import batch, empty_root, obj, objects
from tests.integration.layout_helpers import cat_of

TYPES = ("person", "place", "thing")


def new_world(client: SyncNessieClient) -> str:
    world_id = f"t{uuid.uuid4().hex[:10]}"
    client.create_branch(f"world-{world_id}", empty_root(client))
    return world_id


def type_only_world(client: SyncNessieClient, settings, **committer_kw):  # type: ignore[no-untyped-def]
    """A new world, a committer with type-only projections, and a function committing a batch of
    events to the world at the next offsets."""
    world = new_world(client)
    committer = BatchCommitter(settings.replace(projection_buckets=0), client, **committer_kw)
    offset = 0

    def commit(events, name):  # type: ignore[no-untyped-def]
        nonlocal offset
        committer.commit_batch(batch(world, name, events, offset))
        offset += len(events)

    return world, committer, commit


def live_files(cat, name: str = COMMON.name):  # type: ignore[no-untyped-def]
    return list(cat.load_table(("onto", name)).scan().plan_files())


def test_a_small_flush_writes_one_file_and_the_merge_splits_it_by_type(client, sink_settings, monkeypatch) -> None:
    world = new_world(client)
    settings = sink_settings.replace(projection_buckets=0)  # type only: no bucket in the default spec
    # A tier is merged past 3 small files here (16 in production), so four flushes fill it.
    committer = BatchCommitter(settings, client, max_small_files=3)
    offset = 0

    def commit(events, name):  # type: ignore[no-untyped-def]
        nonlocal offset
        committer.commit_batch(batch(world, name, events, offset))
        offset += len(events)

    model: dict[str, tuple[int, bool]] = {}
    first = [obj(world, f"{t}{i}", "CREATE", 1, typ=t, n=i) for t in TYPES for i in range(20)]
    commit(first, "first")
    model.update({f"{t}{i}": (1, False) for t in TYPES for i in range(20)})

    cat = cat_of(committer, world)
    table = cat.load_table(("onto", COMMON.name))
    default = table.spec()
    assert [f.name for f in default.fields] == ["object_type_id"], "the default spec stays type only"
    unpartitioned = [s.spec_id for s in table.specs().values() if s.is_unpartitioned()]
    assert len(unpartitioned) == 1 and unpartitioned[0] != default.spec_id
    (u,) = unpartitioned
    files = live_files(cat)
    assert [(t.file.spec_id, t.file.record_count) for t in files] == [(u, 60)], "one file for three types"

    # Reads of the one file: by type (pyiceberg plans it under its own spec), and through the lookup.
    for t in TYPES:
        rows = table.scan(row_filter=EqualTo("object_type_id", t)).to_arrow()
        assert sorted(rows.column("object_pk").to_pylist()) == sorted(f"{t}{i}" for i in range(20))

    # Updates and deletes of keys in it: their position deletes are under its spec.
    second = [obj(world, f"person{i}", "UPDATE", 2, n=100 + i) for i in range(5)]
    second += [obj(world, f"place{i}", "DELETE", 2, typ="place") for i in range(3)]
    commit(second, "second")
    model.update({f"person{i}": (2, False) for i in range(5)})
    model.update({f"place{i}": (2, True) for i in range(3)})
    assert {k: v[:2] for k, v in objects(cat).items()} == model
    files = live_files(cat)
    first_path = next(t.file.file_path for t in files if t.file.record_count == 60)
    deletes = {d.spec_id for t in files if t.file.file_path == first_path for d in t.delete_files}
    assert deletes == {u}, "deletes of an unpartitioned file are under its spec"

    # `causeway tables show`: the unpartitioned spec listed, not current, and its partition counted.
    monkeypatch.setenv("CAUSEWAY_WAREHOUSE", settings.warehouse)
    monkeypatch.setenv("CAUSEWAY_PROJECTION_BUCKETS", "0")
    shown = CliRunner().invoke(cli, ["tables", "show", world, COMMON.name, "--json"])
    assert shown.exit_code == 0, shown.output
    report = orjson.loads(shown.output)
    assert [(s["spec_id"], s["spec"], s["default"]) for s in report["specs"]] == [
        (default.spec_id, "identity(object_type_id)", True),
        (u, "none", False),
    ]
    text = CliRunner().invoke(cli, ["tables", "show", world, COMMON.name]).output
    assert f"spec {u}: none  (small flushes of several partitions; merged into the current spec)" in text
    parts = {(p["spec_id"], p["partition"]): p for p in report["partitions"]}
    assert parts[(u, "(unpartitioned)")]["data_files"] == 2 and parts[(u, "(unpartitioned)")]["delete_files"] == 1
    assert report["data_files"] == len(files) and report["rows"] == sum(t.file.record_count for t in files)

    # Three more small flushes of every type: the third finds 4 unpartitioned files (> 3) and its
    # merge rewrites them into the type partitions, one file per type; its own file stays.
    for n in (3, 4, 5):
        keys = range(2 * n, 2 * n + 2)  # other keys each time: a file whose rows all go is dropped, not merged
        more = [obj(world, f"{t}{i}", "UPDATE", n, typ=t, n=n) for t in TYPES for i in keys]
        commit(more, f"flush{n}")
        model.update({f"{t}{i}": (n, False) for t in TYPES for i in keys})
    files = live_files(cat)
    by_spec = Counter(t.file.spec_id for t in files)
    assert by_spec[u] == 1, f"the unpartitioned files were merged: {by_spec}"
    merged = [t.file for t in files if t.file.spec_id == default.spec_id]
    assert sorted(f.partition[0] for f in merged) == sorted(TYPES), "one file per type"
    assert {k: v[:2] for k, v in objects(cat).items()} == model

    # After the merge: updates, deletes and a lookup of keys it moved, then a rebuild from the log.
    last = [obj(world, f"thing{i}", "DELETE", 9, typ="thing") for i in range(2)]
    last += [obj(world, f"person{i}", "UPDATE", 9, n=9) for i in range(18, 20)]
    commit(last, "last")
    model.update({f"thing{i}": (9, True) for i in range(2)})
    model.update({f"person{i}": (9, False) for i in range(18, 20)})
    assert {k: v[:2] for k, v in objects(cat).items()} == model
    result = rebuild(settings, world, write=False)
    assert result.identical, [d.sample() for d in result.diffs]


def test_a_flush_splits_its_rows_by_partition_once(client, sink_settings, monkeypatch) -> None:
    """The writer takes the split that counted the flush's partitions (``_write_batches``): a small
    flush of one type cut its rows twice, once to count partitions and again to write them."""
    import sinks.rowdelta as rowdelta

    world, committer, commit = type_only_world(client, sink_settings, max_small_files=3)
    commit([obj(world, f"{t}{i}", "CREATE", 1, typ=t, n=i) for t in TYPES for i in range(10)], "first")
    splits: list[tuple[int, int]] = []  # (spec fields, rows) of every projection split under a partitioned spec
    keyed_runs = rowdelta._keyed_runs

    def counted(df, spec, schema):  # type: ignore[no-untyped-def]
        if "object_pk" in df.column_names and not spec.is_unpartitioned():
            splits.append((len(spec.fields), df.num_rows))
        return keyed_runs(df, spec, schema)

    monkeypatch.setattr(rowdelta, "_keyed_runs", counted)
    commit([obj(world, f"person{i}", "UPDATE", 2, n=50 + i) for i in range(4)], "one type")
    assert splits == [(1, 4)], "one split of the flush's 4 rows, by type"
    splits.clear()
    commit([obj(world, f"{t}{i}", "UPDATE", 3, typ=t, n=60 + i) for t in TYPES for i in range(2)], "three types")
    assert splits == [(1, 6)], "one split to count the types; the rows are written as one file"
    model = {f"{t}{i}": (1, False) for t in TYPES for i in range(10)}
    model.update({f"person{i}": (2, False) for i in range(4)})
    model.update({f"{t}{i}": (3, False) for t in TYPES for i in range(2)})
    assert {k: v[:2] for k, v in objects(cat_of(committer, world)).items()} == model


def test_a_small_flush_writes_the_live_rows_of_a_file_it_empties_in_its_own_one_file(client, sink_settings) -> None:
    """A flush that deletes most rows of a file rewrites it (``compact_below``); its live rows go
    into the flush's one file, not into a file per type: one data file for the commit, not three."""
    from sinks.rowdelta import plan_live_files

    world, committer, commit = type_only_world(client, sink_settings)
    commit([obj(world, f"{t}{i}", "CREATE", 1, typ=t, n=i) for t in TYPES for i in range(10)], "first")
    model = {f"{t}{i}": (1, False) for t in TYPES for i in range(10)}
    cat = cat_of(committer, world)
    (first,) = live_files(cat)
    # 16 of the first file's 30 rows replaced: under half live, so the flush rewrites its 14 rows.
    second = [obj(world, f"person{i}", "UPDATE", 2, n=20 + i) for i in range(10)]
    second += [obj(world, f"place{i}", "DELETE", 2, typ="place") for i in range(6)]
    commit(second, "second")
    model.update({f"person{i}": (2, False) for i in range(10)})
    model.update({f"place{i}": (2, True) for i in range(6)})

    table = cat.load_table(("onto", COMMON.name))
    summary = table.current_snapshot().summary
    assert (summary["added-data-files"], summary["deleted-data-files"]) == ("1", "1"), summary
    assert summary["total-position-deletes"] == "0", "the emptied file was removed, not masked"
    (now,) = live_files(cat)
    assert now.file.file_path != first.file.file_path and now.file.spec_id == first.file.spec_id
    assert now.file.record_count == 30 and not now.delete_files
    assert {k: v[:2] for k, v in objects(cat).items()} == model  # pyiceberg's scan
    (task,) = plan_live_files(table)  # the key lookup's planning
    assert task.file.file_path == now.file.file_path and not task.delete_files
    for t in TYPES:  # a read by type plans the one file under its own spec
        rows = table.scan(row_filter=EqualTo("object_type_id", t)).to_arrow()
        assert sorted(rows.column("object_pk").to_pylist()) == sorted(f"{t}{i}" for i in range(10))
    result = rebuild(sink_settings.replace(projection_buckets=0), world, write=False)
    assert result.identical, [d.sample() for d in result.diffs]
