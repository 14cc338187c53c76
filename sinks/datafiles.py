"""Parquet data files of a flush: pyiceberg's file layout and statistics, its set-up paid once per call.

pyiceberg's ``write_file`` converts the table schema (``sanitize_column_names``), reads its
``Config``, builds the statistics plan and the Parquet path → field id map, projects every batch to
the file schema and opens a ``ParquetWriter`` for **each file** (~3-5 ms of CPU per file before any
row is encoded: ``bench.layout_commit_cpu``, 48 ms for the 12 data files of a partitioned flush
against 14 for the unpartitioned one). A partitioned flush writes one file per (type, bucket) it
touches, so the fixed part is derived once per table schema and ``write.*`` properties here
(:func:`_setup`) and each file is one ``ParquetWriter``.

A file holds what pyiceberg's writer writes (Parquet field ids, the Arrow schema in the footer, the
table's compression and page settings). Iceberg's column metrics (value, null and NaN counts, lower and
upper bounds, by the table's ``write.metadata.metrics.*`` modes) come from the Parquet statistics
exactly as pyiceberg computes them: the log's reads prune by the bounds of (entity_type, entity_pk,
version) and ``occurred_at`` (docs/architecture.md, "Table layout").
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionKey
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record

from sinks.errors import UnsupportedFileFormat
from sinks.fileio import open_output, write_file
from sinks.lru import Lru
from sinks.tables import arrow_schema

#: Below this many in-memory bytes a call writes its files in the calling thread: encoding a small
#: file takes less CPU than handing it to a pool thread and waking the caller again.
POOL_MIN_BYTES = 4 * 1024 * 1024
#: Below this many in-memory bytes of rows a file is encoded into memory and written with one
#: ``write_file`` (no 1 MiB stream buffer per file); above, it is streamed to storage as encoded.
IN_MEMORY_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class _Setup:
    """What every file of a table needs, derived from its schema and ``write.*`` properties only."""

    file_schema: Schema
    arrow_schema: pa.Schema
    stats_plan: dict[int, Any]
    column_ids: dict[str, int]
    kwargs: dict[str, Any]
    row_group_size: int | None
    #: Parquet column path -> how its Iceberg metrics are taken; None: pyiceberg's function does it.
    metrics: dict[str, _Metrics] | None


@dataclass(frozen=True)
class _Metrics:
    """One column's metrics plan, resolved once per set-up: pyiceberg's statistics function builds
    a mode, an aggregator (with a schema visit for the physical type) and, per bound, a transform
    and a serializer dispatch for every column of every file (~1 ms of CPU a file, 2-5 % of a small
    commit)."""

    field_id: int
    counts: bool  # value and null counts
    bounds: bool  # lower and upper bounds
    physical: str  # the Parquet physical type the serializers expect
    #: The bounds taken as Parquet's physical values (``min_raw``): for numbers, dates, times and
    #: timestamps they are what the serializer packs, and pyarrow's logical ``min`` builds a
    #: ``datetime`` (with its time zone) for each timestamp bound only for it to become micros again
    #: (~23 µs a timestamp column of a file against 0.3).
    raw: bool
    lower: Callable[[Any], bytes | None]
    upper: Callable[[Any], bytes | None]


def _metrics_plan(stats_plan: dict[int, Any], column_ids: dict[str, int]) -> dict[str, _Metrics] | None:
    """Per Parquet column, pyiceberg's ``data_file_statistics_from_parquet_metadata`` steps, with
    everything that depends on the schema and properties only taken out of the per-file loop.

    None when a column needs what only pyiceberg's function does (decimals stored as integers).
    """
    from pyiceberg.conversions import to_bytes
    from pyiceberg.io.pyarrow import MetricModeTypes, _primitive_to_physical
    from pyiceberg.transforms import TruncateTransform
    from pyiceberg.types import (
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        StringType,
        TimestampNanoType,
        TimestampType,
        TimestamptzNanoType,
        TimestamptzType,
        TimeType,
    )

    raw_types = (
        BooleanType,
        IntegerType,
        LongType,
        FloatType,
        DoubleType,
        DateType,
        TimeType,
        TimestampType,
        TimestamptzType,
        TimestampNanoType,
        TimestamptzNanoType,
    )
    from pyiceberg.utils.truncate import truncate_upper_bound_binary_string, truncate_upper_bound_text_string

    def serializer(kind: Any) -> Callable[[Any], bytes]:
        fn = to_bytes.dispatch(type(kind))
        return lambda v: fn(kind, v)

    plan: dict[str, _Metrics] = {}
    for path, field_id in column_ids.items():
        col = stats_plan[field_id]
        kind, mode, length = col.iceberg_type, col.mode.type, col.mode.length
        if isinstance(kind, DecimalType):
            return None
        ser = serializer(kind)
        lower: Callable[[Any], bytes | None] = ser
        upper: Callable[[Any], bytes | None] = ser
        if mode == MetricModeTypes.TRUNCATE and length is not None:
            if isinstance(kind, (StringType, BinaryType)):
                # pyiceberg's TruncateTransform of a string or binary is ``v[0:min(width, len(v))]``,
                # reached through two closures and a pydantic private attribute per bound
                # (~7 µs a string column of a file against ~1).
                lower = _prefix_lower(ser, length)
            else:
                lower = _truncated_lower(ser, TruncateTransform(width=length).transform(kind))
            if isinstance(kind, StringType):
                upper = _truncated_upper(ser, truncate_upper_bound_text_string, length)
            elif isinstance(kind, BinaryType):
                upper = _truncated_upper(ser, truncate_upper_bound_binary_string, length)
            else:
                return None  # pyiceberg raises; let it
        plan[path] = _Metrics(
            field_id,
            mode != MetricModeTypes.NONE,
            mode in (MetricModeTypes.TRUNCATE, MetricModeTypes.FULL),
            _primitive_to_physical(kind),
            isinstance(kind, raw_types),
            lower,
            upper,
        )
    return plan


def _truncated_lower(ser: Callable[[Any], bytes], cut: Callable[[Any], Any]) -> Callable[[Any], bytes | None]:
    return lambda v: ser(cut(v))


def _prefix_lower(ser: Callable[[Any], bytes], length: int) -> Callable[[Any], bytes | None]:
    return lambda v: ser(v[:length])


def _truncated_upper(
    ser: Callable[[Any], bytes], round_up: Callable[[Any, int], Any], length: int
) -> Callable[[Any], bytes | None]:
    """pyiceberg's upper bound of a truncated column: the prefix rounded up, none when it cannot be."""

    def upper(v: Any) -> bytes | None:
        t = round_up(v, length)
        return None if t is None else ser(t)

    return upper


def file_metrics(parquet: pq.FileMetaData, plan: dict[str, _Metrics]) -> dict[str, Any] | None:
    """The Iceberg metrics of a written Parquet file, as pyiceberg's
    ``data_file_statistics_from_parquet_metadata(...).to_serialized_dict()`` gives them. Pure.

    None when a column is not as the plan expects (another physical type, no statistics): the
    caller then asks pyiceberg's function, which knows the promotions and warns.
    """
    sizes: dict[int, int] = {}
    counts: dict[int, int] = {}
    nulls: dict[int, int] = {}
    mins: dict[int, Any] = {}
    maxes: dict[int, Any] = {}
    bounded: dict[int, _Metrics] = {}
    splits: list[int] = []
    for r in range(parquet.num_row_groups):
        group = parquet.row_group(r)
        first = group.column(0)
        data, dictionary = first.data_page_offset, first.dictionary_page_offset
        splits.append(dictionary if first.has_dictionary_page and dictionary < data else data)
        for pos in range(parquet.num_columns):
            column = group.column(pos)
            m = plan[column.path_in_schema]
            fid = m.field_id
            sizes[fid] = sizes.get(fid, 0) + column.total_compressed_size
            if not m.counts:
                continue
            counts[fid] = counts.get(fid, 0) + column.num_values
            if not column.is_stats_set:
                return None
            st = column.statistics
            if st.has_null_count:
                nulls[fid] = nulls.get(fid, 0) + st.null_count
            if not m.bounds:
                continue
            if st.physical_type != m.physical:
                return None
            try:
                lo, hi = (st.min_raw, st.max_raw) if m.raw else (st.min, st.max)
            except pa.ArrowNotImplementedError:
                return None
            bounded[fid] = m
            if lo is not None:
                old = mins.get(fid)
                mins[fid] = lo if old is None else min(lo, old)
            if hi is not None:
                old = maxes.get(fid)
                maxes[fid] = hi if old is None else max(hi, old)
    splits.sort()
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    for fid, v in mins.items():
        b = bounded[fid].lower(v)
        if b is not None:
            lower[fid] = b
    for fid, v in maxes.items():
        b = bounded[fid].upper(v)
        if b is not None:
            upper[fid] = b
    return {
        "record_count": parquet.num_rows,
        "column_sizes": sizes,
        "value_counts": counts,
        "null_value_counts": nulls,
        "nan_value_counts": {},
        "lower_bounds": lower,
        "upper_bounds": upper,
        "split_offsets": splits,
    }


#: Set-ups by (schema fields, ``write.*`` properties): a commit writes each table once or twice
#: and the schema changes rarely, so the per-call set-up (~1.5 ms for the log) is paid per schema.
_SETUPS: Lru[tuple[Any, ...], _Setup] = Lru(256)
#: The same set-ups by (schema object, ``write.*`` properties), checked by identity.
_BY_ID: Lru[tuple[Any, ...], tuple[Schema, _Setup]] = Lru(4096)
#: Every world's tables have schema objects of their own (~3 a world), and a worker commits its
#: worlds round robin: bounded like ``_SETUPS``, 100 worlds' 300 schemas emptied the map before
#: any came round again, so every flush hashed its schema's fields. An entry is a key and a held
#: schema (the set-up is shared), so the bound is the tables of ~1,300 worlds. Both maps drop their
#: least recently used entry at the bound (they were emptied whole: every table then paid its
#: set-up again at once).
_LOCK = threading.Lock()


def _setup(schema: Schema, properties: dict[str, str]) -> _Setup:
    from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, compute_statistics_plan, parquet_path_to_id_mapping
    from pyiceberg.schema import sanitize_column_names
    from pyiceberg.table import TableProperties
    from pyiceberg.utils.properties import property_as_int

    # Only ``write.*`` properties shape a file (format, Parquet settings, metrics modes); the log's
    # committed-offset map, a property too, changes with every commit.
    written = tuple(sorted((k, v) for k, v in properties.items() if k.startswith("write.")))
    # A table's schema object lives as long as its kept metadata (``sinks.table_metadata.CACHE``),
    # so a world's commits find their set-up by its identity; hashing the fields (the key by
    # value, for a schema parsed anew) is ~25 µs of a ~40 µs writer set-up, paid per flush.
    by_id = (id(schema), written)
    with _LOCK:
        kept = _BY_ID.recent(by_id)
    if kept is not None and kept[0] is schema:
        return kept[1]
    key = (tuple(schema.fields), tuple(schema.identifier_field_ids), written)
    with _LOCK:
        found = _SETUPS.recent(key)
    if found is not None:
        _keep_by_id(by_id, schema, found)
        return found
    file_format = properties.get(TableProperties.WRITE_FILE_FORMAT, TableProperties.WRITE_FILE_FORMAT_DEFAULT)
    if FileFormat(file_format) != FileFormat.PARQUET:
        raise UnsupportedFileFormat(f"causeway writes Parquet data files only; the table asks for {file_format}")
    sanitized = sanitize_column_names(schema)
    file_schema = sanitized if sanitized != schema else schema
    stats_plan = compute_statistics_plan(file_schema, properties)
    column_ids = parquet_path_to_id_mapping(file_schema)
    found = _Setup(
        file_schema,
        arrow_schema(file_schema),
        stats_plan,
        column_ids,
        _get_parquet_writer_kwargs(properties),
        property_as_int(
            properties, TableProperties.PARQUET_ROW_GROUP_LIMIT, TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT
        ),
        _metrics_plan(stats_plan, column_ids),
    )
    with _LOCK:
        _SETUPS.keep(key, found)
    _keep_by_id(by_id, schema, found)
    return found


def _keep_by_id(key: tuple[Any, ...], schema: Schema, setup: _Setup) -> None:
    # The schema is held with its set-up, so its id is not reused while the entry lives.
    with _LOCK:
        _BY_ID.keep(key, (schema, setup))


class FileWriter:
    """Writes Parquet data files for one table metadata (schema, properties) under one of its
    specs (the default unless ``spec_id`` names another)."""

    def __init__(self, metadata: Any, io: FileIO, spec_id: int | None = None) -> None:
        from pyiceberg.io.pyarrow import ParquetFormatModel
        from pyiceberg.table.locations import load_location_provider

        self.metadata = metadata
        self.io = io
        setup = _setup(metadata.schema(), metadata.properties)
        self.file_schema = setup.file_schema
        self.arrow_schema = setup.arrow_schema
        self.stats_plan = setup.stats_plan
        self.column_ids = setup.column_ids
        self.kwargs = setup.kwargs
        self.row_group_size = setup.row_group_size
        self.metrics = setup.metrics
        self.format_model = ParquetFormatModel()
        self.location = load_location_provider(table_location=metadata.location, table_properties=metadata.properties)
        self.spec_id = metadata.default_spec_id if spec_id is None else spec_id
        self.write_uuid = uuid.uuid4()
        self._written = 0

    def to_file_schema(self, df: pa.Table) -> pa.Table:
        """``df`` under the file schema (names, field ids, types) as pyiceberg's writer projects it.

        Rows the committer builds are already in the table's Arrow schema: then nothing is copied.
        """
        from pyiceberg.io.pyarrow import _to_requested_schema, pyarrow_to_schema

        if df.schema.equals(self.arrow_schema, check_metadata=True):
            return df
        source = pyarrow_to_schema(
            df.schema, name_mapping=self.file_schema.name_mapping, format_version=self.metadata.format_version
        )
        batches = [
            _to_requested_schema(
                requested_schema=self.file_schema,
                file_schema=source,
                batch=b,
                include_field_ids=True,
                format_model=self.format_model,
            )
            for b in df.to_batches()
        ]
        if not batches:
            return self.arrow_schema.empty_table()
        return pa.Table.from_batches(batches)

    def write(
        self, chunks: Sequence[tuple[pa.Table, PartitionKey | None]], executor: Executor | None
    ) -> list[DataFile]:
        """One data file per ``(rows, partition key)`` chunk, in order; rows in any schema that
        pyiceberg's writer takes (projected to the file schema here)."""
        names = []
        for _ in chunks:
            names.append(f"00000-{self._written}-{self.write_uuid}.parquet")
            self._written += 1
        jobs = list(zip(chunks, names, strict=True))
        if executor is None or len(jobs) < 2 or sum(c.nbytes for (c, _), _ in jobs) < POOL_MIN_BYTES:
            return [self._write_one(c, key, name) for (c, key), name in jobs]
        return list(executor.map(lambda job: self._write_one(job[0][0], job[0][1], job[1]), jobs))

    def _encode(self, rows: pa.Table, sink: Any) -> pq.FileMetaData:
        """Write ``rows`` as one Parquet file to ``sink``; the file's Parquet metadata."""
        # The footer keeps the Arrow schema (~1.9 KiB of a small file): without it Parquet reads
        # give ``string`` where the table's Arrow schema has ``large_string``, and every
        # ``pq.read_table`` of causeway (row reads, the key index, the small-file merge) would
        # need its own cast.
        with pq.ParquetWriter(sink, schema=rows.schema, store_decimal_as_integer=True, **self.kwargs) as writer:
            writer.write(rows, row_group_size=self.row_group_size)
        return writer.writer.metadata

    def _write_one(self, rows: pa.Table, key: PartitionKey | None, name: str) -> DataFile:
        from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata

        rows = self.to_file_schema(rows)
        path = self.location.new_data_location(data_file_name=name, partition_key=key)
        if rows.nbytes <= IN_MEMORY_MAX_BYTES:
            # A small flush's file: encoded into memory, created with one open and one write.
            buffer = pa.BufferOutputStream()
            metadata = self._encode(rows, buffer)
            size = write_file(self.io, path, buffer.getvalue())
        else:
            with open_output(self.io, path) as f:
                metadata = self._encode(rows, f)
                size = f.tell()  # the whole file: the writer closed it with the footer; no stat after
        stats = None if self.metrics is None else file_metrics(metadata, self.metrics)
        if stats is None:
            stats = data_file_statistics_from_parquet_metadata(
                parquet_metadata=metadata, stats_columns=self.stats_plan, parquet_column_mapping=self.column_ids
            ).to_serialized_dict()
        df = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=key.partition if key is not None else Record(),
            file_size_in_bytes=size,
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
            **stats,
        )
        # Not an Avro field of DataFile: from_args drops it. A file under a spec other than the
        # default (a small projection flush's) goes to that spec's manifest by it (``RowDelta``).
        df.spec_id = self.spec_id
        return df
