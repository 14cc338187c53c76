"""Reading the two sides of a diff: live files, deleted positions and the rows ``worlds.diff`` plans.

Files are found through pyiceberg's scan planning (so partitioned and unpartitioned tables read
alike); data files are read by path, only the compared columns, and only those the plan names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table

from sinks.rowdelta import FileCache
from worlds.diff import COMPARE_COLUMNS, EntityChange, ReadPlan, SchemaChange, entity_changes, plan_reads, schema_diff


@dataclass
class TableDiff:
    """The diff of one projection table, with what it cost to compute."""

    table: str
    changes: list[EntityChange] = field(default_factory=list)
    schema: list[SchemaChange] = field(default_factory=list)
    data_files_read: list[str] = field(default_factory=list)
    data_files_skipped: int = 0
    delete_files_read: int = 0
    bytes_read: int = 0
    rows_read: int = 0
    #: The rows read from each side (the compared columns plus ``extra_columns``), for a merge.
    rows_a: pa.Table | None = None
    rows_b: pa.Table | None = None

    def stats(self) -> dict[str, Any]:
        return {
            "data_files_read": len(self.data_files_read),
            "data_files_skipped": self.data_files_skipped,
            "delete_files_read": self.delete_files_read,
            "bytes_read": self.bytes_read,
            "rows_read": self.rows_read,
        }


@dataclass
class _Side:
    table: Table | None
    files: dict[str, int] = field(default_factory=dict)  # live data file → size
    deleted: dict[str, pa.Array] = field(default_factory=dict)


def _side(table: Table | None, deletes: FileCache, out: TableDiff) -> _Side:
    side = _Side(table)
    if table is None or table.current_snapshot() is None:
        return side
    per_file: dict[str, list[pa.Array]] = {}
    seen_deletes: dict[str, dict[str, pa.Array]] = {}
    for task in table.scan().plan_files():
        side.files[task.file.file_path] = task.file.file_size_in_bytes
        for df in task.delete_files:
            if df.file_path not in seen_deletes:
                t, hit = deletes.get(table.io, df.file_path, None)
                if not hit:
                    out.delete_files_read += 1
                    out.bytes_read += df.file_size_in_bytes
                paths = t.column("file_path")
                seen_deletes[df.file_path] = {
                    p: t.column("pos").filter(pc.equal(paths, p)).combine_chunks() for p in pc.unique(paths).to_pylist()
                }
            pos = seen_deletes[df.file_path].get(task.file.file_path)
            if pos is not None:
                per_file.setdefault(task.file.file_path, []).append(pos)
    side.deleted = {p: pa.concat_arrays(v) for p, v in per_file.items()}
    return side


def _columns(table: Table, type_col: str, pk_col: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    names = set(table.schema().column_names)
    return (type_col, pk_col) + tuple(c for c in COMPARE_COLUMNS + extra if c in names)


def _positions(n: int) -> pa.Array:
    return pa.array(range(n), pa.int64())


def _rows(side: _Side, path: str, columns: tuple[str, ...], keep: pa.Array | None) -> pa.Table:
    """Rows of ``path`` for one side: the given positions, or every live row when ``keep`` is None."""
    assert side.table is not None
    t, _ = FileCache(0).get(side.table.io, path, columns)
    if keep is not None:
        return t.take(keep)
    deleted = side.deleted.get(path)
    if deleted is not None and len(deleted):
        t = t.filter(pc.invert(pc.is_in(_positions(t.num_rows), value_set=deleted)))
    return t


def diff_table(
    name: str,
    kind: str,
    a: Table | None,
    b: Table | None,
    type_col: str,
    pk_col: str,
    progress: Callable[[int], None] | None = None,
    extra_columns: tuple[str, ...] = (),
) -> TableDiff:
    """The entity and schema diff of one projection table between two pinned loads of it."""
    out = TableDiff(name)
    out.schema = schema_diff(a.schema() if a else None, b.schema() if b else None)
    deletes = FileCache(64 * 1024 * 1024)  # a delete file shared by both sides is read once
    side_a, side_b = _side(a, deletes, out), _side(b, deletes, out)
    plan: ReadPlan = plan_reads(
        {p: side_a.deleted.get(p) for p in side_a.files}, {p: side_b.deleted.get(p) for p in side_b.files}
    )
    out.data_files_skipped = len(plan.skipped)
    parts_a: list[pa.Table] = []
    parts_b: list[pa.Table] = []
    for read in plan.reads:
        size = side_a.files.get(read.path) or side_b.files.get(read.path) or 0
        out.data_files_read.append(read.path)
        out.bytes_read += size
        if read.whole_a or (read.a_positions is not None and len(read.a_positions)):
            assert a is not None
            rows = _rows(
                side_a,
                read.path,
                _columns(a, type_col, pk_col, extra_columns),
                None if read.whole_a else read.a_positions,
            )
            parts_a.append(rows)
            out.rows_read += rows.num_rows
        if read.whole_b or (read.b_positions is not None and len(read.b_positions)):
            assert b is not None
            rows = _rows(
                side_b,
                read.path,
                _columns(b, type_col, pk_col, extra_columns),
                None if read.whole_b else read.b_positions,
            )
            parts_b.append(rows)
            out.rows_read += rows.num_rows
        if progress is not None:
            progress(1)
    rows_a = _concat(parts_a)
    rows_b = _concat(parts_b)
    out.changes = entity_changes(kind, rows_a, rows_b, type_col, pk_col)
    out.rows_a, out.rows_b = rows_a, rows_b
    return out


def _concat(parts: list[pa.Table]) -> pa.Table | None:
    if not parts:
        return None
    names = [n for n in parts[0].column_names if all(n in p.column_names for p in parts)]
    return pa.concat_tables([p.select(names) for p in parts], promote_options="permissive")
