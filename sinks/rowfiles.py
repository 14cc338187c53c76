"""Rows of a table's data files: read one file under the current schema, read selected live rows,
stage a merge-on-read replacement (new rows + position deletes) in a transaction.

Shared by the committer, compaction, schema sync's backfill and reconciliation's repair.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.table import Table, Transaction

from sinks.flush_stats import FlushStats
from sinks.rowdelta import FileCache, RowDelta, read_state, write_data_files, write_partition_deletes
from sinks.tables import TableDef, arrow_schema


def kept_rows(table: Table, path: str, cache: FileCache | None) -> pa.Table | None:
    """The rows of ``path`` its writer kept in ``cache``, when they are under the table's current schema."""
    kept = None if cache is None else cache.rows(path)
    # Field ids included (Arrow field metadata): a column dropped and added again under its old
    # name and type is another column, which the kept rows do not hold.
    if kept is not None and kept.schema.equals(arrow_schema(table.schema()), check_metadata=True):
        return kept
    return None


def read_data_file(table: Table, path: str) -> pa.Table:
    """A data file's rows in file order, under the table's *current* schema.

    Columns are matched by Iceberg field id, so a file written before a rename reads under the new
    name, one written before an added column reads it as null, and a widened column is promoted.
    """
    from pyiceberg.io.pyarrow import _to_requested_schema, pyarrow_to_schema

    with table.io.new_input(path).open() as f:
        raw = pq.read_table(f)
    file_schema = pyarrow_to_schema(raw.schema)
    wanted = table.schema()
    batches = [_to_requested_schema(wanted, file_schema, b) for b in raw.to_batches()]
    target = arrow_schema(wanted)
    return pa.Table.from_batches(batches, schema=target) if batches else target.empty_table()


def read_rows(
    table: Table, tdef: TableDef, match: Callable[[pa.Table], pa.Array], cache: FileCache | None = None
) -> pa.Table | None:
    """Full live rows (current schema) that ``match`` selects on the key columns, with ``_file``/``_pos``.

    ``match`` sees the key columns plus ``version``, ``deleted`` and ``event_id``. Files with no
    selected row are not read in full.
    """
    type_col, pk_col = tdef.key
    state = read_state(table, [type_col, pk_col, "version", "deleted", "event_id"], match, cache)
    if state.index is None:
        return None
    parts: list[pa.Table] = []
    index = state.index
    for path in pc.unique(index.column("_file")).to_pylist():
        pos = index.filter(pc.equal(index.column("_file"), path)).column("_pos")
        rows = read_data_file(table, path).take(pos)
        rows = rows.append_column("_pos", pos.combine_chunks()).append_column(
            "_file", pa.array([path] * len(pos), pa.string())
        )
        parts.append(rows)
    return pa.concat_tables(parts)


def stage_replacement(
    tx: Transaction, table: Table, rows: pa.Table, deletes: Mapping[str, Sequence[int]], properties: dict[str, str]
) -> FlushStats:
    """Add ``rows`` (current schema) and mask ``deletes`` ({data file: positions}) in one snapshot of ``tx``.

    The merge-on-read write of a repair or a backfill; ``tx`` is committed by the caller (inside
    catalog staging, so the change is published with the rest of its Nessie commit).
    """
    stats = FlushStats()
    rd = RowDelta(tx, properties)
    if rows.num_rows:
        files = write_data_files(tx.table_metadata, rows, table.io)
        rd.add(files)
        stats.rows_written = rows.num_rows
        stats.files_added += len(files)
        stats.bytes_written += sum(f.file_size_in_bytes for f in files)
    if any(deletes.values()):
        dfiles = write_partition_deletes(table, None, {p: list(v) for p, v in deletes.items()})
        rd.add(dfiles)
        stats.rows_deleted = sum(d.record_count for d in dfiles)
        stats.files_added += len(dfiles)
        stats.bytes_written += sum(d.file_size_in_bytes for d in dfiles)
    if not rd.empty:
        rd.commit()
    return stats
