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
from collections.abc import Sequence
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
from sinks.tables import arrow_schema

#: Below this many in-memory bytes a call writes its files in the calling thread: encoding a small
#: file takes less CPU than handing it to a pool thread and waking the caller again.
POOL_MIN_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class _Setup:
    """What every file of a table needs, derived from its schema and ``write.*`` properties only."""

    file_schema: Schema
    arrow_schema: pa.Schema
    stats_plan: dict[int, Any]
    column_ids: dict[str, int]
    kwargs: dict[str, Any]
    row_group_size: int | None


#: Set-ups by (schema fields, ``write.*`` properties): a commit writes each table once or twice
#: and the schema changes rarely, so the per-call set-up (~1.5 ms for the log) is paid per schema.
_SETUPS: dict[tuple[Any, ...], _Setup] = {}
_SETUPS_MAX = 256
_LOCK = threading.Lock()


def _setup(schema: Schema, properties: dict[str, str]) -> _Setup:
    from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, compute_statistics_plan, parquet_path_to_id_mapping
    from pyiceberg.schema import sanitize_column_names
    from pyiceberg.table import TableProperties
    from pyiceberg.utils.properties import property_as_int

    # Only ``write.*`` properties shape a file (format, Parquet settings, metrics modes); the log's
    # committed-offset map, a property too, changes with every commit.
    written = tuple(sorted((k, v) for k, v in properties.items() if k.startswith("write.")))
    key = (tuple(schema.fields), tuple(schema.identifier_field_ids), written)
    with _LOCK:
        found = _SETUPS.get(key)
    if found is not None:
        return found
    file_format = properties.get(TableProperties.WRITE_FILE_FORMAT, TableProperties.WRITE_FILE_FORMAT_DEFAULT)
    if FileFormat(file_format) != FileFormat.PARQUET:
        raise UnsupportedFileFormat(f"causeway writes Parquet data files only; the table asks for {file_format}")
    sanitized = sanitize_column_names(schema)
    file_schema = sanitized if sanitized != schema else schema
    found = _Setup(
        file_schema,
        arrow_schema(file_schema),
        compute_statistics_plan(file_schema, properties),
        parquet_path_to_id_mapping(file_schema),
        _get_parquet_writer_kwargs(properties),
        property_as_int(
            properties, TableProperties.PARQUET_ROW_GROUP_LIMIT, TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT
        ),
    )
    with _LOCK:
        if len(_SETUPS) >= _SETUPS_MAX:
            _SETUPS.clear()
        _SETUPS[key] = found
    return found


class FileWriter:
    """Writes Parquet data files for one table metadata (schema, spec, properties)."""

    def __init__(self, metadata: Any, io: FileIO) -> None:
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
        self.format_model = ParquetFormatModel()
        self.location = load_location_provider(table_location=metadata.location, table_properties=metadata.properties)
        self.spec_id = metadata.default_spec_id
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

    def _write_one(self, rows: pa.Table, key: PartitionKey | None, name: str) -> DataFile:
        from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata

        rows = self.to_file_schema(rows)
        path = self.location.new_data_location(data_file_name=name, partition_key=key)
        out = self.io.new_output(path)
        with out.create(overwrite=True) as f:
            # The footer keeps the Arrow schema (~1.9 KiB of a small file): without it Parquet reads
            # give ``string`` where the table's Arrow schema has ``large_string``, and every
            # ``pq.read_table`` of causeway (row reads, the key index, the small-file merge) would
            # need its own cast.
            with pq.ParquetWriter(f, schema=rows.schema, store_decimal_as_integer=True, **self.kwargs) as writer:
                writer.write(rows, row_group_size=self.row_group_size)
            metadata = writer.writer.metadata
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=metadata, stats_columns=self.stats_plan, parquet_column_mapping=self.column_ids
        )
        return DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=key.partition if key is not None else Record(),
            file_size_in_bytes=len(out),
            sort_order_id=None,
            spec_id=self.spec_id,
            equality_ids=None,
            key_metadata=None,
            **stats.to_serialized_dict(),
        )
