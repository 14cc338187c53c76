"""Layouts (pure): spec text, evolution plans, pruning filters, log compaction choices, log row order."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyiceberg.transforms import BucketTransform
from pyiceberg.typedef import Record
from pyiceberg.types import StringType

from models.events import ChangeEvent, ChangeType
from ops.rebuild.plan import fold
from sinks.layout import (
    DEFAULT_LAYOUTS,
    Layout,
    LayoutError,
    PartField,
    format_spec,
    from_iceberg,
    key_filter,
    parse_sort,
    parse_spec,
    partition_spec,
    plan_evolution,
    sort_order,
)
from sinks.logcompact import Candidate, choose, cut, tier
from sinks.rows import events_arrow
from sinks.tables import ALL_TABLES, COMMON, EVENTS
from tests.factories import change_event


def test_spec_text_round_trips_through_iceberg() -> None:
    spec = parse_spec("identity(object_type_id), bucket(16, object_pk)")
    assert spec == (PartField("identity", "object_type_id"), PartField("bucket", "object_pk", 16))
    assert format_spec(spec) == "identity(object_type_id), bucket(16, object_pk)"
    iceberg = partition_spec(spec, COMMON.schema)
    assert [f.name for f in iceberg.fields] == ["object_type_id", "object_pk_bucket_16"]
    assert from_iceberg(iceberg, COMMON.schema) == spec
    assert parse_spec("object_type_id") == (PartField("identity", "object_type_id"),)
    assert parse_spec("none") == () and parse_spec("default", "entity_events") == DEFAULT_LAYOUTS["entity_events"].spec


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("bucket(x, object_pk)", "positive number"),
        ("bucket(0, object_pk)", "positive number"),
        ("frob(object_pk)", "unknown transform"),
        ("day(a, b)", "takes one column"),
        ("bucket(16, object_pk", "unbalanced"),
        ("object_pk, object_pk", "repeated"),
        ("a b", "not a partition term"),
    ],
)
def test_bad_spec_text_is_one_clear_error(text: str, needle: str) -> None:
    with pytest.raises(LayoutError, match=needle):
        parse_spec(text)


def test_a_spec_must_fit_the_schema() -> None:
    with pytest.raises(LayoutError, match="no column 'nope'"):
        partition_spec(parse_spec("day(nope)"), EVENTS.schema)
    with pytest.raises(LayoutError, match="cannot partition"):
        partition_spec(parse_spec("day(entity_pk)"), EVENTS.schema)
    with pytest.raises(LayoutError, match="not a column name"):
        parse_sort("a, b c")


def test_default_layouts_build_on_their_tables() -> None:
    for tdef in ALL_TABLES:
        layout = DEFAULT_LAYOUTS[tdef.name]
        assert from_iceberg(tdef.spec, tdef.schema) == layout.spec
        assert [tdef.schema.find_column_name(f.source_id) for f in tdef.sort_order.fields] == list(layout.sort)
    assert sort_order((), EVENTS.schema).is_unsorted


def test_evolution_keeps_shared_fields_and_names_the_rest() -> None:
    old = Layout(parse_spec("identity(object_type_id), bucket(16, object_pk)"), ("object_pk",))
    new = Layout(parse_spec("identity(object_type_id), bucket(32, object_pk)"), ("object_pk",))
    evo = plan_evolution(old, new)
    assert evo.remove == (PartField("bucket", "object_pk", 16),)
    assert evo.add == (PartField("bucket", "object_pk", 32),)
    assert evo.spec_changed and not evo.sort_changed
    assert not plan_evolution(new, new).changed


def _bucket16(pk: str) -> int:
    return int(BucketTransform(16).transform(StringType())(pk))


def test_key_scan_keeps_only_the_buckets_its_keys_fall_in() -> None:
    spec = partition_spec(parse_spec("identity(object_type_id), bucket(16, object_pk)"), COMMON.schema)
    pks = [f"p-{i}" for i in range(500)]
    scan = key_filter("object_type_id", "object_pk", [("person", pk) for pk in pks[:3]], ["Gone"])
    want = {_bucket16(pk) for pk in pks[:3]}
    for b in range(16):
        assert scan.keeps(Record("person", b), spec, COMMON.schema) == (b in want)
        assert scan.keeps(Record("Gone", b), spec, COMMON.schema)  # truncated: every file of the type
    unpartitioned = partition_spec((), COMMON.schema)
    assert scan.keeps(Record(), unpartitioned, COMMON.schema)  # old-spec files cannot be pruned
    every = key_filter("object_type_id", "object_pk", [("x", pk) for pk in pks])
    assert all(every.keeps(Record("x", b), spec, COMMON.schema) for b in range(16))


def test_key_scan_keeps_only_the_type_bucket_pairs_its_keys_fall_in() -> None:
    # A batch's keys of one type must not pull in the same buckets of the other types: with T
    # types a flush of random keys would otherwise read every type's file of every touched bucket.
    spec = partition_spec(parse_spec("identity(object_type_id), bucket(16, object_pk)"), COMMON.schema)
    person = [f"p-{i}" for i in range(3)]
    place = [f"q-{i}" for i in range(2)]
    scan = key_filter(
        "object_type_id", "object_pk", [("person", pk) for pk in person] + [("place", pk) for pk in place]
    )
    pairs = {("person", _bucket16(pk)) for pk in person} | {("place", _bucket16(pk)) for pk in place}
    for typ in ("person", "place", "thing"):
        for b in range(16):
            assert scan.keeps(Record(typ, b), spec, COMMON.schema) == ((typ, b) in pairs), (typ, b)
    by_type = partition_spec(parse_spec("identity(object_type_id)"), COMMON.schema)
    assert scan.keeps(Record("place"), by_type, COMMON.schema)
    assert not scan.keeps(Record("thing"), by_type, COMMON.schema)  # a type the batch never names
    by_bucket = partition_spec(parse_spec("bucket(16, object_pk)"), COMMON.schema)
    assert [b for b in range(16) if scan.keeps(Record(b), by_bucket, COMMON.schema)] == sorted({b for _, b in pairs})
    truncating = key_filter("object_type_id", "object_pk", [("person", person[0])], ["Gone"])
    # Without the type in the partition a truncated type's rows may be in any bucket.
    assert all(truncating.keeps(Record(b), by_bucket, COMMON.schema) for b in range(16))


def test_log_compaction_merges_a_full_tier_of_one_partition_only() -> None:
    target = 64 * 1024 * 1024
    small = [Candidate(f"d1-{i}", (1, (10,)), 50_000) for i in range(8)]
    other = [Candidate(f"d2-{i}", (1, (11,)), 50_000) for i in range(7)]
    big = [Candidate("big", (1, (10,)), target)]
    other_tier = [Candidate(f"d1-x{i}", (1, (10,)), 5_000_000) for i in range(3)]
    merges = choose(small + other + big + other_tier, target // 2)
    assert merges == [sorted(c.path for c in small)]
    assert tier(1) == 0 and tier(50_000) < tier(5_000_000)


def test_cut_slices_a_sorted_table_in_order() -> None:
    import pyarrow as pa

    t = pa.table({"k": list(range(1000)), "pad": ["x" * 100] * 1000})
    parts = cut(t, t.nbytes // 4)
    assert len(parts) in (4, 5)
    assert [r for p in parts for r in p.column("k").to_pylist()] == list(range(1000))


def _ev(eid: str, pk: str, change: ChangeType, version: int, typ: str = "person") -> ChangeEvent:
    return change_event(
        eid,
        world="w",
        entity_type=typ,
        pk=pk,
        change=change,
        version=version,
        after=None if change in (ChangeType.DELETE, ChangeType.TRUNCATE) else {"v": version},
        occurred_at_ms=1_700_000_000_000,
        source="t",
    )


def test_log_rows_are_sorted_by_entity_and_keep_their_batch_order_in_batch_seq() -> None:
    # p3 created, the type truncated, then p1 and p2 created: sorted by key the TRUNCATE ('*')
    # comes first, so only batch_seq tells a fold that p3 came before it (and is gone).
    batch = [
        _ev("e1", "p3", ChangeType.CREATE, 1),
        _ev("e2", "*", ChangeType.TRUNCATE, 1),
        _ev("e3", "p1", ChangeType.CREATE, 1),
        _ev("e4", "p2", ChangeType.CREATE, 5),
    ]
    rows = events_arrow([(e, None) for e in batch], "b", datetime.now(UTC), set())
    assert rows.column("entity_pk").to_pylist() == ["*", "p1", "p2", "p3"]
    assert rows.column("batch_seq").to_pylist() == [1, 2, 3, 0]
    folded = fold(rows.to_pylist())
    assert {k: r["version"] for k, r in folded.objects.items()} == {("person", "p1"): 1, ("person", "p2"): 5}


def test_a_legacy_log_without_batch_seq_gets_rows_in_batch_order() -> None:
    from pyiceberg.schema import Schema

    legacy = Schema(*[f for f in EVENTS.schema.fields if f.name != "batch_seq"]).as_arrow()
    batch = [_ev("e1", "p2", ChangeType.CREATE, 1), _ev("e2", "p1", ChangeType.CREATE, 1)]
    rows = events_arrow([(e, None) for e in batch], "b", datetime.now(UTC), set(), legacy)
    assert "batch_seq" not in rows.schema.names
    assert rows.column("entity_pk").to_pylist() == ["p2", "p1"]


def test_the_projection_bucket_count_is_a_setting() -> None:
    from streams.settings import Settings

    four = parse_spec("default", COMMON.name, buckets=4)
    assert format_spec(four) == "identity(object_type_id), bucket(4, object_pk)"
    assert format_spec(parse_spec("default", COMMON.name, buckets=0)) == "identity(object_type_id)"
    assert parse_spec("default", EVENTS.name, buckets=4) == DEFAULT_LAYOUTS[EVENTS.name].spec
    assert from_iceberg(COMMON.spec_with(4), COMMON.schema) == four
    assert len(COMMON.spec_with(0).fields) == 1
    assert Settings.from_env({"CAUSEWAY_PROJECTION_BUCKETS": "4"}).projection_buckets == 4


def test_partition_runs_cut_rows_into_one_slice_per_partition_in_their_order() -> None:
    import pyarrow as pa
    from pyiceberg.io.pyarrow import _determine_partitions

    from sinks.rowdelta import partition_runs

    spec = partition_spec(parse_spec("default", COMMON.name, buckets=4), COMMON.schema)
    n = 400
    rows = pa.table(
        {
            "object_type_id": pa.array(["widget" if i % 3 else "gadget" for i in range(n)]),
            "object_pk": pa.array([f"pk-{i * 7919 % n}" for i in range(n)]),
            "version": pa.array(range(n), pa.int64()),
        }
    )
    runs = partition_runs(rows, spec, COMMON.schema)
    expected = {
        tuple(p.partition_key.partition): p.arrow_table_partition.column("version").to_pylist()
        for p in _determine_partitions(spec, COMMON.schema, rows)
    }
    assert len(runs) == len(expected) == 8  # 2 types × 4 buckets
    got = {}
    for run in runs:
        types = set(run.column("object_type_id").to_pylist())
        buckets = {BucketTransform(4).transform(StringType())(pk) for pk in run.column("object_pk").to_pylist()}
        assert len(types) == 1 and len(buckets) == 1, "a slice holds one partition"
        got[(types.pop(), buckets.pop())] = run.column("version").to_pylist()
    assert got == expected, "same rows per partition as pyiceberg's writer, in the same order"
    assert partition_runs(rows, partition_spec((), COMMON.schema), COMMON.schema) == [rows]


def test_rows_already_grouped_by_partition_are_sliced_without_a_copy() -> None:
    import pyarrow as pa

    from sinks.rowdelta import partition_runs

    spec = partition_spec(parse_spec("default", COMMON.name, buckets=4), COMMON.schema)
    one = [f"pk-{i}" for i in range(4000) if BucketTransform(4).transform(StringType())(f"pk-{i}") == 1][:500]
    rows = pa.table(
        {
            "object_type_id": pa.array(["widget"] * 300 + ["zed"] * 200),
            "object_pk": pa.array(one),
            "version": pa.array(range(500), pa.int64()),
        }
    )
    runs = partition_runs(rows, spec, COMMON.schema)
    assert [r.num_rows for r in runs] == [300, 200]
    address = rows.column("version").chunk(0).buffers()[1].address
    assert runs[0].column("version").chunk(0).buffers()[1].address == address, "a slice, not a copy"
    assert runs[1].column("version").to_pylist() == list(range(300, 500))
    shuffled = rows.take(pa.array([*range(300, 500), *range(300)]))  # grouped, not in code order
    assert sorted(r.num_rows for r in partition_runs(shuffled, spec, COMMON.schema)) == [200, 300]


def test_data_files_of_every_partition_are_written_in_one_writer_call_like_pyiceberg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: the partitioned layout's extra commit CPU was pyiceberg's writer called once per
    partition (its schema conversion, group-by and pool round each time). One call now writes
    every partition's file, with the partition values and rows pyiceberg's own writer gives."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pyiceberg.io.pyarrow as pio
    from pyiceberg.io import load_file_io
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    from sinks.rowdelta import write_data_files

    spec = partition_spec(parse_spec("default", COMMON.name, buckets=4), COMMON.schema)
    metadata = new_table_metadata(COMMON.schema, spec, UNSORTED_SORT_ORDER, f"file://{tmp_path}", {})
    schema = metadata.schema()
    n = 400
    rows = pa.table(
        {
            f.name: (
                pa.array(["widget" if i % 3 else "gadget" for i in range(n)])
                if f.name == "object_type_id"
                else pa.array([f"pk-{i * 7919 % n}" for i in range(n)])
                if f.name == "object_pk"
                else pa.array(range(n), pa.int64())
                if f.name == "version"
                else pa.nulls(n, f.type)
                if f.nullable
                else pa.array([0] * n, pa.int64()).cast(f.type)
            )
            for f in schema.as_arrow()
        },
        schema=schema.as_arrow(),
    )
    io = load_file_io({}, f"file://{tmp_path}")
    import sinks.datafiles as datafiles

    calls: list[int] = []
    real_write = datafiles.FileWriter.write  # one writer set-up and call for every partition's file
    monkeypatch.setattr(datafiles.FileWriter, "write", lambda *a, **kw: (calls.append(1), real_write(*a, **kw))[1])
    ours = write_data_files(metadata, rows, io)
    assert len(calls) == 1
    calls.clear()
    theirs = list(pio._dataframe_to_data_files(metadata, rows, io))

    def by_partition(files: list) -> dict:  # type: ignore[type-arg]
        return {
            tuple(df.partition): pq.read_table(df.file_path.removeprefix("file://")).column("version").to_pylist()
            for df in files
        }

    assert len(ours) == len(theirs) == 8  # 2 types × 4 buckets, a file each
    assert by_partition(ours) == by_partition(theirs)
    assert sorted(df.record_count for df in ours) == sorted(df.record_count for df in theirs)


def test_delete_files_are_merged_per_partition_not_across_them() -> None:
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    from sinks.rowdelta import deletes_to_merge

    def delete_file(path: str, bucket: int, rows: int) -> DataFile:
        df = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES, file_path=path, file_format=FileFormat.PARQUET,
            partition=Record("widget", bucket), record_count=rows, file_size_in_bytes=100,
        )  # fmt: skip
        df.spec_id = 1
        return df

    # A flush of random keys adds one delete file to each bucket: two flushes over 4 buckets.
    files = {f"d{b}-{n}": delete_file(f"d{b}-{n}", b, 10 + n) for b in range(4) for n in range(2)}
    assert deletes_to_merge(files, files, 3) == [], "no partition would hold more than 3"
    # One partition at the limit: the smaller half of that partition only, never another's.
    files["d1-2"] = delete_file("d1-2", 1, 12)
    assert deletes_to_merge(files, files, 3) == ["d1-0", "d1-1"]


def test_a_small_file_merge_never_rewrites_a_few_files_into_the_tier_they_came_from() -> None:
    """Each flush leaves a small file in every partition it touches; merging only the start of a
    partition's full tier (what the budget leaves) would write a file of that same tier, which the
    next merge of that tier rewrites again."""
    import pyarrow as pa
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    from sinks.compaction import Compaction
    from sinks.rowdelta import LiveFile, TableState

    def data_file(path: str, bucket: int, rows: int) -> DataFile:
        df = DataFile.from_args(
            content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
            partition=Record("widget", bucket), record_count=rows, file_size_in_bytes=3_300 + 41 * rows,
        )  # fmt: skip
        df.spec_id = 1
        return df

    policy = Compaction(64 * 1024 * 1024, 100, small_files_min_rows=4096)  # budget: 4,096 rows
    # Two partitions with a full tier (17 files): bucket 0's tier 0 (17 x 100 rows) is merged first
    # and leaves 2,396 rows of the budget, enough for one of bucket 1's 1,400-row files (tier 1).
    files = {f"b0-{i:02d}": data_file(f"b0-{i:02d}", 0, 100) for i in range(17)}
    files |= {f"b1-{i:02d}": data_file(f"b1-{i:02d}", 1, 1_400) for i in range(17)}
    state = TableState(files={p: LiveFile(df, pa.array([], pa.int64())) for p, df in files.items()})
    picked = [p for p, _ in policy.pick(state, {})]
    assert sorted(picked) == sorted(p for p in files if p.startswith("b0-")), "no part of bucket 1's tier"
    # With budget for most of a tier, its start is merged: that file lands a tier up and the
    # partition's file count falls.
    many = {f"b2-{i:02d}": data_file(f"b2-{i:02d}", 2, 400) for i in range(17)}
    state = TableState(files={p: LiveFile(df, pa.array([], pa.int64())) for p, df in many.items()})
    picked = [p for p, _ in policy.pick(state, {})]
    assert picked == sorted(many)[:10]  # 10 x 400 rows of the 4,096


def test_small_file_tiers_in_bytes_are_set_by_the_footer_and_in_rows_by_the_rows() -> None:
    """A small projection file's bytes are mostly its Parquet footer: by bytes a 1-row and a
    60-row file share a tier (and 17 of them are merged), by rows they do not."""
    import pyarrow as pa
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    from sinks.compaction import Compaction
    from sinks.rowdelta import LiveFile, TableState

    def live(path: str, rows: int) -> LiveFile:
        df = DataFile.from_args(
            content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
            partition=Record("widget"), record_count=rows, file_size_in_bytes=3_300 + 41 * rows,
        )  # fmt: skip
        df.spec_id = 1
        return LiveFile(df, pa.array([], pa.int64()))

    files = {f"one-{i:02d}": live(f"one-{i:02d}", 1) for i in range(10)}
    files |= {f"sixty-{i:02d}": live(f"sixty-{i:02d}", 60) for i in range(7)}
    state = TableState(files=files)
    assert sorted(p for p, _ in Compaction(64 * 1024 * 1024, 100).pick(state, {})) == sorted(files)
    assert Compaction(64 * 1024 * 1024, 100, tiers_in_rows=True).pick(state, {}) == []


def test_a_small_delete_file_carries_no_footer_overhead_and_reads_back(tmp_path: Path) -> None:
    """A partitioned flush writes one delete file per partition: its fixed bytes count per partition."""
    import pyarrow.parquet as pq
    from pyiceberg.io import load_file_io
    from pyiceberg.io.pyarrow import _read_deletes

    from sinks.rowdelta import write_position_deletes

    io = load_file_io({}, f"file://{tmp_path}")
    data = [
        f"file://{tmp_path}/data/object_type_id=person/object_pk_bucket_4={b}/{b:05d}-0-abc.parquet" for b in range(2)
    ]
    written = write_position_deletes(
        io, f"file://{tmp_path}/delete-1.parquet", {data[0]: range(0, 550, 2), data[1]: [7]}
    )
    assert written is not None
    meta = pq.ParquetFile(tmp_path / "delete-1.parquet").metadata
    assert b"ARROW:schema" not in (meta.metadata or {})
    assert meta.row_group(0).column(0).statistics is None  # file_path: the manifest holds its bounds
    assert written.file_size_in_bytes < 1600  # 2,698 bytes with the Arrow schema and file_path statistics
    back = _read_deletes(io, written)
    assert back[data[0]].to_pylist() == list(range(0, 550, 2)) and back[data[1]].to_pylist() == [7]
