"""A small projection flush writes one file under the unpartitioned spec (issue 21, rewrite amplification)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from bench.small_files_model import keys_axis, run
from sinks.compaction import Compaction, Rewrites
from sinks.layout import parse_spec, partition_spec, unpartitioned_spec, writes_one_file
from sinks.rowdelta import LiveFile, TableState
from sinks.tables import COMMON

SMALL = 16 * 1024 * 1024


def test_a_small_flush_of_several_partitions_writes_one_file_unless_its_spec_has_a_bucket() -> None:
    by_type = partition_spec(parse_spec("identity(object_type_id)"), COMMON.schema)
    bucketed = partition_spec(parse_spec("identity(object_type_id), bucket(4, object_pk)"), COMMON.schema)
    assert writes_one_file(by_type, 3, 10_000, SMALL)
    assert not writes_one_file(by_type, 1, 10_000, SMALL), "one partition: its own file is already one"
    assert not writes_one_file(by_type, 3, SMALL, SMALL), "a large flush: its files are not merged, keep them pruned"
    assert not writes_one_file(bucketed, 3, 10_000, SMALL), "bucketed: flushes read only their buckets"


def test_the_unpartitioned_spec_is_reused_or_added_with_the_next_id() -> None:
    by_type = partition_spec(parse_spec("identity(object_type_id)"), COMMON.schema)
    added = unpartitioned_spec({0: by_type})
    assert added.is_unpartitioned() and added.spec_id == 1
    legacy = partition_spec((), COMMON.schema)  # spec 0 of a table created before layouts
    specs = {0: legacy, 1: by_type.model_copy(update={"spec_id": 1})}
    assert unpartitioned_spec(specs).spec_id == 0


def test_a_data_file_written_under_another_spec_carries_that_spec(tmp_path: Path) -> None:
    """``RowDelta`` files an added data file in the manifest of its ``spec_id``: one without it
    would be listed under the default (type) spec with an empty partition."""
    from pyiceberg.io import load_file_io
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    from sinks.rowdelta import write_data_files, write_data_files_with_rows

    spec = partition_spec(parse_spec("identity(object_type_id)"), COMMON.schema)
    metadata = new_table_metadata(COMMON.schema, spec, UNSORTED_SORT_ORDER, f"file://{tmp_path}", {})
    schema = metadata.schema().as_arrow()
    n = 30
    columns = {
        "object_type_id": pa.array(["a", "b", "c"] * (n // 3)),
        "object_pk": pa.array([f"pk-{i}" for i in range(n)]),
    }
    rows = pa.table(
        {
            f.name: columns.get(f.name)
            or (pa.nulls(n, f.type) if f.nullable else pa.array([0] * n, pa.int64()).cast(f.type))
            for f in schema
        },
        schema=schema,
    )
    io = load_file_io({}, f"file://{tmp_path}")
    one = unpartitioned_spec(metadata.specs())
    ((df, held),) = write_data_files_with_rows(metadata, rows, io, one)
    assert (df.spec_id, tuple(df.partition), df.record_count) == (one.spec_id, (), n)
    assert held.num_rows == n
    per_type = write_data_files(metadata, rows, io)
    assert sorted((f.spec_id, tuple(f.partition)) for f in per_type) == [(0, ("a",)), (0, ("b",)), (0, ("c",))]


def test_the_merge_takes_unpartitioned_files_as_their_own_group() -> None:
    """The one-file flushes fill their own tier (spec, ()) and are merged together, never with a
    type partition's files; the writer puts their rows back into the type partitions."""

    def live(path: str, spec_id: int, partition: Record, rows: int) -> LiveFile:
        df = DataFile.from_args(
            content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
            partition=partition, record_count=rows, file_size_in_bytes=3_300 + 30 * rows,
        )  # fmt: skip
        df.spec_id = spec_id
        return LiveFile(df, pa.array([], pa.int64()))

    files = {f"u-{i:02d}": live(f"u-{i:02d}", 1, Record(), 90) for i in range(17)}
    files |= {f"t-{i:02d}": live(f"t-{i:02d}", 0, Record("person"), 90) for i in range(16)}
    picked = [p for p, _ in Compaction(64 * 1024 * 1024, 100).pick(TableState(files=files), {})]
    assert sorted(picked) == sorted(p for p in files if p.startswith("u-"))


def test_a_one_file_flush_left_sparse_is_rewritten_with_the_flush_within_its_budget() -> None:
    """``Compaction.picks``: an unpartitioned (one-file flush) file that this flush leaves under
    half live goes with the flush's rows; a sparse type file, the sparse files over the flush's
    budget, and a merge's files go to their partitions. The same files are picked either way."""

    def live(path: str, partition: Record, rows: int, dead: int = 0) -> LiveFile:
        df = DataFile.from_args(
            content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
            partition=partition, record_count=rows, file_size_in_bytes=3_300 + 30 * rows,
        )  # fmt: skip
        df.spec_id = 0 if len(partition) else 1
        return LiveFile(df, pa.array(range(dead), pa.int64()))

    policy = Compaction(64 * 1024 * 1024, 100)
    files = {"u-old": live("u-old", Record(), 100, 40), "t-old": live("t-old", Record("person"), 100, 40)}
    files |= {"u-new": live("u-new", Record(), 100)}
    # 15 more rows of each old file go (45 % live), 20 of the newest: budget 2 x 50 = 100 rows.
    deletes = {"u-old": list(range(40, 55)), "t-old": list(range(40, 55)), "u-new": list(range(20))}
    with_flush, by_partition = policy.picks(TableState(files=files), deletes)
    assert [p for p, _ in with_flush] == ["u-old"] and with_flush[0][1] == set(range(55))
    assert [p for p, _ in by_partition] == ["t-old"]
    assert sorted(p for p, _ in policy.pick(TableState(files=files), deletes)) == ["t-old", "u-old"]

    # Two sparse one-file flushes whose 90 live rows exceed the budget of 2 x 20: both still
    # rewritten (the first alone may exceed it), but into their partitions.
    files = {"u-a": live("u-a", Record(), 100, 45), "u-b": live("u-b", Record(), 100, 45)}
    deletes = {"u-a": list(range(45, 55)), "u-b": list(range(45, 55))}
    with_flush, by_partition = policy.picks(TableState(files=files), deletes)
    assert with_flush == [] and [p for p, _ in by_partition] == ["u-a"]

    # A merge of a full tier of one-file flushes: to the partitions (the merge moves them there).
    files = {f"u-{i:02d}": live(f"u-{i:02d}", Record(), 90) for i in range(17)}
    with_flush, by_partition = policy.picks(TableState(files=files), {})
    assert with_flush == [] and len(by_partition) == 17


def test_the_replay_predicts_the_unpartitioned_tables_rewrites_for_one_file_flushes() -> None:
    """``python -m bench.small_files_model --keys-axis --writer one-file``: at the keys axis's
    flushes a type-partitioned table (3 partitions) whose small flushes write one file supersedes
    what the unpartitioned table does; with a file per partition it superseded 3-4x the bytes."""
    for seed in (1, 2, 3):
        flushes = keys_axis(5, 20_000, 35, seed)
        unpartitioned = run(1, flushes, 1_000_000, 3_300, 30)
        one_file = run(3, flushes, 1_000_000, 3_300, 30, one_file=True)
        per_partition = run(3, flushes, 1_000_000, 3_300, 30)
        assert one_file["bytes_superseded"] == unpartitioned["bytes_superseded"]
        assert per_partition["bytes_superseded"] > 1.8 * unpartitioned["bytes_superseded"]


def _common_rows(schema: pa.Schema, types: list[str], first: int = 0) -> pa.Table:
    n = len(types)
    columns = {
        "object_type_id": pa.array(types),
        "object_pk": pa.array([f"pk-{first + i}" for i in range(n)]),
        "version": pa.array(range(first, first + n), pa.int64()),
    }
    return pa.table(
        {
            f.name: columns.get(f.name)
            if f.name in columns
            else (pa.nulls(n, f.type) if f.nullable else pa.array([0] * n, pa.int64()).cast(f.type))
            for f in schema
        },
        schema=schema,
    )


def test_a_flushs_write_plan_hands_the_split_that_counted_its_partitions_to_the_writer(tmp_path: Path) -> None:
    """``_write_batches``: one split of the flush's rows both decides one file or one per type and
    is what is written; carried rows join their partitions as a split of all the rows would."""
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    from sinks.projection_write import _write_batches
    from sinks.rowdelta import split_rows

    spec = partition_spec(parse_spec("identity(object_type_id)"), COMMON.schema)
    metadata = new_table_metadata(COMMON.schema, spec, UNSORTED_SORT_ORDER, f"file://{tmp_path}", {})
    schema = metadata.schema().as_arrow()

    three = _common_rows(schema, ["a", "b", "c", "a"])
    (one_file,), added = _write_batches(metadata, three, Rewrites(), SMALL)
    assert added is not None and added.is_unpartitioned() and one_file.spec is added
    assert [run.num_rows for run, _ in one_file.runs] == [4], "three types, one file"

    (per_type,), added = _write_batches(metadata, three, Rewrites(), 1)  # not small: a file per type
    assert added is None and per_type.spec.spec_id == spec.spec_id and per_type.partitions == 3

    single = _common_rows(schema, ["b", "b"])
    carried = [_common_rows(schema, ["a", "b"], 10), _common_rows(schema, ["c", "b"], 20)]
    (split,), added = _write_batches(metadata, single, Rewrites(by_partition=carried), SMALL)
    whole = split_rows(pa.concat_tables([single, *carried]), spec, metadata.schema())
    assert added is None

    def versions(s):  # type: ignore[no-untyped-def]
        return {tuple(values): run.column("version").to_pylist() for run, values in s.runs}

    assert versions(split) == versions(whole) == {("b",): [0, 1, 11, 21], ("a",): [10], ("c",): [20]}

    (rows_split, carried_split), added = _write_batches(metadata, three, Rewrites(by_partition=carried), SMALL)
    assert added is not None and rows_split.spec is added and carried_split.spec.spec_id == spec.spec_id
    assert versions(carried_split) == {("a",): [10], ("b",): [11, 21], ("c",): [20]}, "merged rows by type"


def test_a_small_flush_writes_the_live_rows_of_files_it_rewrote_for_their_deletes_in_its_one_file(
    tmp_path: Path,
) -> None:
    """The rows of an earlier one-file flush that this flush left sparse (``Rewrites.with_flush``)
    go into the flush's one file instead of a file per type (up to three more small files a
    commit); a merge's rows still go to their types, and a large flush joins both to their types."""
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    from sinks.projection_write import _write_batches

    spec = partition_spec(parse_spec("identity(object_type_id)"), COMMON.schema)
    metadata = new_table_metadata(COMMON.schema, spec, UNSORTED_SORT_ORDER, f"file://{tmp_path}", {})
    schema = metadata.schema().as_arrow()
    single = _common_rows(schema, ["b", "b"])
    sparse = [_common_rows(schema, ["a", "b"], 10), _common_rows(schema, ["c", "b"], 20)]

    (one,), added = _write_batches(metadata, single, Rewrites(with_flush=sparse), SMALL)
    assert added is not None and one.spec is added, "new rows of one type and carried rows of three: one file"
    assert [run.column("version").to_pylist() for run, _ in one.runs] == [[0, 1, 10, 11, 20, 21]]

    (with_merge, merged), _ = _write_batches(
        metadata, single, Rewrites(with_flush=sparse[:1], by_partition=sparse[1:]), SMALL
    )
    assert with_merge.spec.is_unpartitioned() and with_merge.num_rows == 4
    assert merged.spec.spec_id == spec.spec_id and merged.partitions == 2, "a merge's rows still go to their types"

    (large,), added = _write_batches(metadata, single, Rewrites(with_flush=sparse), 1)
    assert added is None and large.spec.spec_id == spec.spec_id
    assert {tuple(v): run.num_rows for run, v in large.runs} == {("a",): 1, ("b",): 4, ("c",): 1}


def test_the_replay_with_deletes_writes_one_data_and_one_delete_file_a_dense_flush_with_the_policys_split() -> None:
    """``python -m bench.sparse_model``: 1,000 keys, 144 random updates a flush. Rewritten rows of
    emptied one-file flushes written by type made ~3.7 data and 4 delete files a flush; with
    ``Compaction.picks``'s split, one of each, at about the same rows rewritten."""
    from bench.sparse_model import run as replay

    before = replay("by-partition", 1000, 144, flushes=120, warmup=40)
    now = replay("picks", 1000, 144, flushes=120, warmup=40)
    assert before["data files"] > 3 and before["delete files"] > 3
    assert (now["data files"], now["delete files"], now["manifests"]) == (1.0, 1.0, 2.0)
    assert now["rows rewritten"] < 1.1 * before["rows rewritten"]


def test_a_table_of_fresh_keys_keeps_a_bounded_number_of_files_per_partition() -> None:
    """Flushes that delete little (a soak's fresh keys: 700 rows a flush, one file each, three
    types) must still merge full tiers. Failed before: at a 4,096-row floor the ~4k-row files of
    a full tier fit no flush's budget, so the files per partition grew with the table (71 after 900
    flushes, 131 after 1,800; the soak's tables held ~160 after 12 minutes)."""
    at_900 = run(3, [700] * 900, 0, 3_300, 50, one_file=True)
    at_1800 = run(3, [700] * 1800, 0, 3_300, 50, one_file=True)
    assert at_1800["most_in_a_partition"] <= 30
    assert at_1800["most_in_a_partition"] - at_900["most_in_a_partition"] <= 5
    assert at_1800["rows_superseded"] / at_1800["rows_written"] < 2.0  # each row rewritten about twice
