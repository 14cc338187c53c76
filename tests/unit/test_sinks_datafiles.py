"""Data files of a flush (sinks/datafiles.py through rowdelta.write_data_files_with_rows): what
pyiceberg's writer would write, with its set-up paid once per call."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import PyArrowFileIO, _dataframe_to_data_files
from pyiceberg.table.metadata import new_table_metadata

from sinks.lru import Lru
from sinks.rowdelta import write_data_files_with_rows
from sinks.tables import COMMON, table_properties
from tests.calls import count_calls, counting_local_fs


def _metadata(tmp_path: Path) -> Any:
    return new_table_metadata(
        COMMON.schema,
        COMMON.spec_with(4),
        COMMON.sort_order,
        f"file://{tmp_path}/t",
        table_properties(1 << 20),
    )


def _rows(metadata: Any, n: int) -> pa.Table:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    return pa.Table.from_pylist(
        [
            {
                "object_type_id": ("person", "place")[i % 2],
                "object_pk": f"k{i:05d}",
                "version": i,
                "properties": None if i % 7 == 0 else f'{{"n": {i}}}',
                "deleted": i % 7 == 0,
                "updated_at": now,
                "committed_at": now,
                "event_id": f"e{i}",
                "batch_id": "b1",
                "schema_version": 0,
            }
            for i in range(n)
        ],
        schema=metadata.schema().as_arrow(),
    )


def _local(path: str) -> str:
    return path.removeprefix("file://")


def test_the_writer_is_set_up_once_per_schema_not_per_file_or_flush(tmp_path: Path, monkeypatch: Any) -> None:
    # pyiceberg's writer built its statistics plan (a schema visitor) and more for every file; a
    # partitioned flush writes one file per (type, bucket) it touches (failed before: 8 plans for
    # 8 files; then one per call until the set-up was kept per schema).
    import pyiceberg.io.pyarrow as pyarrow_io

    plans = count_calls(monkeypatch, pyarrow_io, "compute_statistics_plan")
    import sinks.datafiles

    sinks.datafiles._SETUPS.clear()  # noqa: SLF001 - counted from a cold process
    sinks.datafiles._BY_ID.clear()  # noqa: SLF001
    metadata = _metadata(tmp_path)
    written = write_data_files_with_rows(metadata, _rows(metadata, 200), PyArrowFileIO())
    assert len(written) == 8  # 2 types x 4 buckets
    # The next flush of the table (same schema and write properties; other properties, such as the
    # log's committed-offset map, change every commit) sets nothing up again.
    later = metadata.model_copy(update={"properties": {**metadata.properties, "causeway.committed-offsets": "x"}})
    write_data_files_with_rows(later, _rows(later, 50), PyArrowFileIO())
    assert len(plans) == 1
    for data_file, _ in written:
        # Readers map columns by Parquet field id: every column keeps its id.
        arrow = pq.read_schema(_local(data_file.file_path))
        assert [f.metadata[b"PARQUET:field_id"] for f in arrow] == [
            str(f.field_id).encode() for f in metadata.schema().fields
        ]
        assert arrow.equals(metadata.schema().as_arrow())  # read back as written (large strings)


def test_a_flush_finds_its_writer_set_up_by_the_schema_object_without_hashing_its_fields(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # The set-up was looked up by the schema's fields, hashed for every flush (~25 µs of a ~40 µs
    # writer set-up; failed before: 10 field hashes for the second flush). A world's commits
    # hand the same schema object on (the kept metadata).
    from pyiceberg.types import NestedField

    from sinks.datafiles import FileWriter

    metadata = _metadata(tmp_path)
    first = FileWriter(metadata, PyArrowFileIO())
    hashes = count_calls(monkeypatch, NestedField, "__hash__")
    later = metadata.model_copy(update={"properties": {**metadata.properties, "causeway.committed-offsets": "y"}})
    again = FileWriter(later, PyArrowFileIO())
    assert hashes == [] and again.stats_plan is first.stats_plan
    # An equal schema parsed anew (another object) finds the same set-up by its fields.
    parsed = type(metadata).model_validate_json(metadata.model_dump_json())
    assert parsed.schema() is not metadata.schema()
    assert FileWriter(parsed, PyArrowFileIO()).stats_plan is first.stats_plan


def _tables_of_their_own(tmp_path: Path, monkeypatch: Any, n: int, bound: int) -> list[Any]:
    """``n`` equal table metadata, each with schema objects of its own (as every world's tables
    have), and a fresh identity map of set-ups bounded at ``bound``."""
    import sinks.datafiles

    monkeypatch.setattr(sinks.datafiles, "_BY_ID", Lru(bound))
    base = _metadata(tmp_path)
    return [type(base).model_validate_json(base.model_dump_json()) for _ in range(n)]


def test_the_tables_of_a_hundred_worlds_committed_round_robin_find_their_set_ups_by_identity(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # Each world's tables hold schema objects of their own, and a worker commits its worlds in
    # turn. The identity map was bounded at 256 and emptied when full: with 300 tables (100
    # worlds, 3 tables) no schema was still there when its world came round again. Failed
    # before: 3,000 field hashes in the second round (10 for each of 300 tables).
    from pyiceberg.types import NestedField

    from sinks.datafiles import FileWriter

    tables = _tables_of_their_own(tmp_path, monkeypatch, 300, bound=4096)
    assert len({id(t.schema()) for t in tables}) == 300
    first = [FileWriter(t, PyArrowFileIO()) for t in tables]
    hashes = count_calls(monkeypatch, NestedField, "__hash__")
    again = [FileWriter(t, PyArrowFileIO()) for t in tables]
    assert hashes == []
    assert all(a.stats_plan is f.stats_plan for a, f in zip(again, first, strict=True))


def test_a_full_set_up_map_drops_its_least_recently_used_table_not_every_table(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # At its bound the identity map was emptied whole, so every table paid its set-up again at once
    # (a cliff every ~1,300 worlds' worth of tables). Failed before: the table used just before the
    # bound was reached hashed its schema's fields again.
    from pyiceberg.types import NestedField

    import sinks.datafiles
    from sinks.datafiles import FileWriter

    tables = _tables_of_their_own(tmp_path, monkeypatch, 5, bound=4)
    for t in tables[:4]:
        FileWriter(t, PyArrowFileIO())
    FileWriter(tables[0], PyArrowFileIO())  # used again: now the most recent
    FileWriter(tables[4], PyArrowFileIO())  # past the bound: the least recently used (tables[1]) goes
    hashes = count_calls(monkeypatch, NestedField, "__hash__")
    for t in (tables[0], tables[2], tables[3], tables[4]):
        FileWriter(t, PyArrowFileIO())
    assert hashes == []
    FileWriter(tables[1], PyArrowFileIO())
    assert hashes != []  # the one that went is found by its fields again
    assert len(sinks.datafiles._BY_ID) == 4  # noqa: SLF001


def test_string_bounds_are_cut_without_pyiceberg_truncate_transform_per_file(tmp_path: Path, monkeypatch: Any) -> None:
    # pyiceberg's truncate of a string reaches ``v[0:min(width, len(v))]`` through two closures
    # and a pydantic private attribute, for every string column of every file (failed before: 5
    # calls for 5 string columns' lower bounds of one file). The bounds are pyiceberg's
    # (``test_file_metrics_are_pyiceberg_metrics_without_its_per_file_function``); long values too:
    from pyiceberg.transforms import TruncateTransform

    import sinks.datafiles

    cuts: list[Any] = []
    real = TruncateTransform.transform

    def counted(self: Any, source: Any) -> Any:
        fn = real(self, source)
        return lambda v: cuts.append(v) or fn(v)

    monkeypatch.setattr(TruncateTransform, "transform", counted)
    monkeypatch.setattr(sinks.datafiles, "_SETUPS", Lru(256))
    monkeypatch.setattr(sinks.datafiles, "_BY_ID", Lru(4096))
    metadata = _metadata(tmp_path)
    rows = _rows(metadata, 3).set_column(1, "object_pk", pa.array(["é" * 20, "a" * 40, "b" * 3], pa.large_string()))
    written = sinks.datafiles.FileWriter(metadata, PyArrowFileIO()).write([(rows, None)], None)[0]
    assert cuts == []
    assert written.lower_bounds[2] == ("a" * 16).encode() and written.upper_bounds[2] == ("é" * 15 + "ê").encode()


def test_data_files_carry_the_partition_and_metrics_pyiceberg_writes(tmp_path: Path) -> None:
    metadata = _metadata(tmp_path)
    rows = _rows(metadata, 300)
    ours = write_data_files_with_rows(metadata, rows, PyArrowFileIO())
    theirs = list(_dataframe_to_data_files(metadata, rows, PyArrowFileIO()))

    def by_partition(files: list[Any]) -> dict[Any, Any]:
        return {tuple(f.partition): f for f in files}

    mine, pyi = by_partition([f for f, _ in ours]), by_partition(theirs)
    assert mine.keys() == pyi.keys()
    for key, f in mine.items():
        g = pyi[key]
        assert f.record_count == g.record_count
        assert f.content == g.content and f.file_format == g.file_format
        assert f.lower_bounds == g.lower_bounds and f.upper_bounds == g.upper_bounds
        assert f.value_counts == g.value_counts and f.null_value_counts == g.null_value_counts
        assert f.nan_value_counts == g.nan_value_counts
        assert set(f.column_sizes) == set(g.column_sizes)
    for data_file, kept in ours:  # the rows handed back are the rows of the file
        read = pq.read_table(_local(data_file.file_path))
        assert read.num_rows == kept.num_rows == data_file.record_count
        assert read.column("object_pk").to_pylist() == kept.column("object_pk").to_pylist()


def test_file_metrics_are_pyiceberg_metrics_without_its_per_file_function(tmp_path: Path, monkeypatch: Any) -> None:
    # pyiceberg's statistics function built a mode, an aggregator, a transform and a serializer
    # dispatch per column per file (~1 ms a file); the plan is now resolved once per set-up
    # (failed before: one call of pyiceberg's function per file written).
    import pyiceberg.io.pyarrow as pyarrow_io

    from sinks import datafiles

    real = pyarrow_io.data_file_statistics_from_parquet_metadata
    calls = count_calls(monkeypatch, pyarrow_io, "data_file_statistics_from_parquet_metadata")
    metadata = _metadata(tmp_path)
    written = write_data_files_with_rows(metadata, _rows(metadata, 40), PyArrowFileIO())
    assert written and calls == []

    # The same numbers and bounds as pyiceberg's function, on files with several row groups, null
    # and all-null columns, strings past the truncation width (upper bounds rounded up), binary
    # and a column without metrics.
    from pyiceberg.io.pyarrow import compute_statistics_plan, parquet_path_to_id_mapping
    from pyiceberg.schema import Schema
    from pyiceberg.types import BinaryType, BooleanType, DoubleType, LongType, NestedField, StringType, TimestamptzType

    schema = Schema(
        NestedField(1, "s", StringType(), required=False),
        NestedField(2, "n", LongType(), required=False),
        NestedField(3, "t", TimestamptzType(), required=False),
        NestedField(4, "b", BinaryType(), required=False),
        NestedField(5, "d", DoubleType(), required=False),
        NestedField(6, "ok", BooleanType(), required=False),
        NestedField(7, "none", StringType(), required=False),
        NestedField(8, "quiet", StringType(), required=False),
    )
    properties = {"write.metadata.metrics.column.quiet": "none", "write.metadata.metrics.column.n": "counts"}
    plan, ids = compute_statistics_plan(schema, properties), parquet_path_to_id_mapping(schema)
    metrics = datafiles._metrics_plan(plan, ids)  # noqa: SLF001 - the plan under test
    assert metrics is not None
    when = datetime(2026, 12, 1, tzinfo=UTC)
    rows = pa.Table.from_pylist(
        [
            {
                "s": None if i % 5 == 0 else "ü" * 20 + str(i),
                "n": i,
                "t": when,
                "b": bytes([255]) * 18 + bytes([i % 256]),
                "d": float(i) / 3,
                "ok": i % 2 == 0,
                "none": None,
                "quiet": "x",
            }
            for i in range(500)
        ],
        schema=schema.as_arrow(),
    )
    path = tmp_path / "m.parquet"
    pq.write_table(rows, path, row_group_size=128)
    parquet = pq.ParquetFile(path).metadata
    assert parquet.num_row_groups == 4
    theirs = real(parquet_metadata=parquet, stats_columns=plan, parquet_column_mapping=ids).to_serialized_dict()
    assert datafiles.file_metrics(parquet, metrics) == theirs


def test_a_partition_directory_is_derived_once_per_partition_not_per_file(tmp_path: Path, monkeypatch: Any) -> None:
    # pyiceberg's PartitionKey.to_path builds the spec's partition type for every file written
    # (failed before: 8 builds for the second flush's 8 files).
    from pyiceberg.partitioning import PartitionSpec

    metadata = _metadata(tmp_path)
    ours = write_data_files_with_rows(metadata, _rows(metadata, 200), PyArrowFileIO())
    real = PartitionSpec.partition_type
    builds = count_calls(monkeypatch, PartitionSpec, "partition_type")
    again = write_data_files_with_rows(metadata, _rows(metadata, 200), PyArrowFileIO())
    assert len(again) == 8 and builds == []
    monkeypatch.setattr(PartitionSpec, "partition_type", real)
    # The directories are pyiceberg's.
    theirs = list(_dataframe_to_data_files(metadata, _rows(metadata, 200), PyArrowFileIO()))

    def directories(paths: list[str]) -> set[str]:
        return {p.rsplit("/", 1)[0] for p in paths}

    assert directories([f.file_path for f, _ in ours]) == directories([f.file_path for f in theirs])


def test_a_data_file_is_written_without_a_stat_or_a_directory_call_per_file(tmp_path: Path) -> None:
    # pyiceberg's output file ran a recursive create_dir of the partition directory before every
    # open, and len(output) stat'ed the file just written for its size (failed before: 8 of each
    # for the second flush's 8 files). Now a directory is created when the open finds it missing.
    metadata = _metadata(tmp_path)
    io = PyArrowFileIO()
    fs, counts = counting_local_fs()
    io.fs_by_scheme = lambda scheme, netloc: fs  # type: ignore[method-assign]
    first = write_data_files_with_rows(metadata, _rows(metadata, 200), io)
    assert len(first) == 8 and counts == {"create_dir": 8, "get_file_info": 0}  # 8 new directories
    counts.update(create_dir=0)
    again = write_data_files_with_rows(metadata, _rows(metadata, 200), io)
    assert len(again) == 8 and counts == {"create_dir": 0, "get_file_info": 0}
    for f, rows in first + again:
        # The size the writer took from its stream is the file's; its rows read back as written.
        assert f.file_size_in_bytes == Path(_local(f.file_path)).stat().st_size
        assert pq.read_table(_local(f.file_path)).equals(rows)


def test_a_data_file_is_what_pyiceberg_output_file_writes(tmp_path: Path) -> None:
    # The same bytes as through io.new_output(path).create(): only the way the file is opened changed.
    from sinks import datafiles

    metadata = _metadata(tmp_path)
    rows = _rows(metadata, 50)
    ours = datafiles.FileWriter(metadata, PyArrowFileIO()).write([(rows, None)], None)[0]
    with PyArrowFileIO().new_output(f"file://{tmp_path}/theirs.parquet").create(overwrite=True) as f:
        w = datafiles.FileWriter(metadata, PyArrowFileIO())
        with pq.ParquetWriter(f, schema=rows.schema, store_decimal_as_integer=True, **w.kwargs) as writer:
            writer.write(rows, row_group_size=w.row_group_size)
    assert Path(_local(ours.file_path)).read_bytes() == (tmp_path / "theirs.parquet").read_bytes()


def test_a_delete_file_is_written_without_a_stat_or_a_directory_call(tmp_path: Path) -> None:
    # A partitioned flush writes a position-delete file per partition it masks rows in; each was
    # opened after a create_dir of its directory and stat'ed for its size (failed before: 3 and 3).
    from pyiceberg.io.pyarrow import _read_deletes

    from sinks.rowdelta import write_position_deletes

    io = PyArrowFileIO()
    fs, counts = counting_local_fs()
    io.fs_by_scheme = lambda scheme, netloc: fs  # type: ignore[method-assign]
    (tmp_path / "d").mkdir()
    data = f"file://{tmp_path}/data/00000-0-abc.parquet"
    written = [write_position_deletes(io, f"file://{tmp_path}/d/del-{n}.parquet", {data: [n, 9]}) for n in range(3)]
    assert counts == {"create_dir": 0, "get_file_info": 0}
    for n, w in enumerate(written):
        assert w is not None and w.file_size_in_bytes == (tmp_path / f"d/del-{n}.parquet").stat().st_size
        assert _read_deletes(io, w)[data].to_pylist() == [n, 9]


def test_file_metrics_of_numbers_dates_and_timestamps_are_pyiceberg_bounds(tmp_path: Path) -> None:
    # These bounds are taken from Parquet's physical values, not pyarrow's logical ones (a datetime
    # built per timestamp bound): the same bytes as pyiceberg's function, across row groups and nulls.
    from datetime import date, time, timedelta

    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BooleanType,
        DateType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        NestedField,
        TimestampType,
        TimestamptzType,
        TimeType,
    )

    from sinks import datafiles

    kinds = [IntegerType(), LongType(), FloatType(), DoubleType(), BooleanType(), DateType(), TimeType()]
    kinds += [TimestampType(), TimestamptzType()]
    schema = Schema(*(NestedField(i + 1, f"c{i}", k, required=False) for i, k in enumerate(kinds)))
    plan, ids = compute_statistics_plan(schema, {}), parquet_path_to_id_mapping(schema)
    metrics = datafiles._metrics_plan(plan, ids)  # noqa: SLF001 - the plan under test
    assert metrics is not None and all(m.raw for m in metrics.values())
    when = datetime(2026, 12, 1, 13, 45, 7, 123456)

    def value(i: int) -> list[Any]:
        step = (i * 7919) % 1000 - 500  # neither sorted nor positive
        return [
            step,
            step * 10**12,
            step / 7,
            step / 3,
            step > 0,
            date(2026, 12, 1) + timedelta(days=step),
            time(13, 45, (step + 500) % 60, 17),
            when + timedelta(seconds=step, microseconds=i),
            (when + timedelta(minutes=step)).replace(tzinfo=UTC),
        ]

    names = [f"c{i}" for i in range(len(kinds))]
    rows = pa.Table.from_pylist(
        [dict(zip(names, [None] * len(kinds) if i % 9 == 0 else value(i), strict=True)) for i in range(600)],
        schema=schema.as_arrow(),
    )
    pq.write_table(rows, tmp_path / "r.parquet", row_group_size=128)
    parquet = pq.ParquetFile(tmp_path / "r.parquet").metadata
    assert parquet.num_row_groups == 5
    theirs = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet, stats_columns=plan, parquet_column_mapping=ids
    ).to_serialized_dict()
    assert datafiles.file_metrics(parquet, metrics) == theirs
