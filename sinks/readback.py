"""Read tables back through pyiceberg: whole branches (what tests, the demo and the benchmark compare)
and the scans of the layers above ``sinks/`` (reconciliation, replay, rebuild, the ApplyChanges saga),
which go through the functions here instead of importing pyiceberg.

Reads go through the Nessie catalog at a reference (branch, ``branch@hash`` or a tag), the same way
any Iceberg reader would see the tables.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import In
from pyiceberg.table import Table

from models.worlds import WorldNaming
from sinks.catalog import NessieCatalog
from sinks.errors import unreadable_if_missing
from sinks.tables import ENTITY_COMMON, ENTITY_EDGE, ENTITY_EVENTS
from streams.settings import Settings


@dataclass
class BranchState:
    ref: str
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # pk -> {type, version, properties}
    links: dict[str, dict[str, Any]] = field(default_factory=dict)
    event_ids: Counter[str] = field(default_factory=Counter)  # event id -> rows in entity_events

    @property
    def duplicate_event_ids(self) -> list[str]:
        return [e for e, n in self.event_ids.items() if n > 1]

    def rows(self) -> dict[str, int]:
        return {
            ENTITY_EVENTS: sum(self.event_ids.values()),
            ENTITY_COMMON: len(self.objects),
            ENTITY_EDGE: len(self.links),
        }


Row = dict[str, Any]
RowProgress = Callable[[str, int, int | None], None]
"""``(table, rows just read, rows in the table or None)``."""


def open_table(catalog: NessieCatalog, namespace: str, table: str) -> Table | None:
    """The table at the catalog's reference, or None when the branch has no such table yet."""
    try:
        return catalog.load_table((namespace, table))
    except NoSuchTableError:
        return None


def present(table: Table, columns: Iterable[str]) -> tuple[str, ...]:
    """``columns`` the table has (a table created before a column existed, ``batch_seq``, lacks it)."""
    names = set(table.schema().column_names)
    return tuple(c for c in columns if c in names)


def scan_rows(
    table: Table | None,
    columns: Iterable[str] | None = None,
    *,
    where: str | None = None,
    progress: RowProgress | None = None,
) -> list[Row]:
    """Rows of ``table`` (None: no table, no rows): the ``columns`` it has (all when None), filtered by
    the row filter ``where`` (pyiceberg's string syntax), read batch by batch and reported to ``progress``."""
    if table is None:
        return []
    kw: dict[str, Any] = {}
    if columns is not None:
        kw["selected_fields"] = present(table, columns)
    if where is not None:
        kw["row_filter"] = where
    rows: list[Row] = []
    total: int | None = None
    if progress is not None:
        snap = table.current_snapshot()
        summary = snap.summary if snap is not None else None
        total = int(summary.get("total-records", "0") or 0) if summary is not None else None
    for batch in table.scan(**kw).to_arrow_batch_reader():
        rows.extend(batch.to_pylist())
        if progress is not None:
            progress(table.name()[-1], batch.num_rows, total)
    return rows


def rows_matching(
    table: Table | None, column: str, values: Iterable[str], columns: Iterable[str], *, chunk: int | None = None
) -> list[Row]:
    """Rows of ``table`` whose ``column`` is one of ``values``: one ``IN`` filter, or one per ``chunk`` values."""
    wanted = list(dict.fromkeys(values))
    if table is None or not wanted:
        return []
    fields = present(table, columns)
    step = chunk or len(wanted)
    rows: list[Row] = []
    for i in range(0, len(wanted), step):
        scan = table.scan(row_filter=In(column, wanted[i : i + step]), selected_fields=fields)  # type: ignore[call-arg, arg-type]
        rows.extend(scan.to_arrow().to_pylist())
    return rows


@dataclass(frozen=True)
class FileRef:
    """A live data file of a table's current snapshot: its path, rows, and the delete files that apply."""

    path: str
    rows: int
    deletes: frozenset[str]


def live_files(table: Table | None) -> list[FileRef]:
    """The current snapshot's live data files (from its manifests, parsed once per manifest)."""
    from sinks.rowdelta import plan_live_files

    if table is None:
        return []
    return [
        FileRef(t.file.file_path, t.file.record_count, frozenset(d.file_path for d in t.delete_files))
        for t in plan_live_files(table)
    ]


def file_columns(table: Table, path: str, columns: Iterable[str]) -> pa.Table:
    """The ``columns`` one data file has, by name, in file order.

    By name, not field id: for columns never renamed (the log's and the projections' key and
    bookkeeping columns); a file written before a column was added lacks it.
    """
    with table.io.new_input(path).open() as f:
        pf = pq.ParquetFile(f)
        names = set(pf.schema_arrow.names)
        return pf.read(columns=[c for c in columns if c in names])


def deleted_positions(table: Table, path: str) -> dict[str, pa.Array]:
    """``{data file: positions}`` a position-delete file masks."""
    from sinks.rowdelta import FileCache, _delete_positions

    return _delete_positions(FileCache(0), table.io, path)[0]


def _scan(catalog: NessieCatalog, namespace: str, table: str, columns: tuple[str, ...]) -> list[Row]:
    return scan_rows(open_table(catalog, namespace, table), columns)


_ROW = ("version", "properties", "deleted")


def _live(rows: list[Row], type_column: str, pk_column: str) -> dict[str, dict[str, Any]]:
    """pk -> {type, version, properties} of the rows that are not tombstones."""
    return {
        row[pk_column]: {
            "type": row[type_column],
            "version": row["version"],
            "properties": orjson.loads(row["properties"]) if row["properties"] else None,
        }
        for row in rows
        if not row["deleted"]
    }


def read_branch(settings: Settings, ref: str, catalog: NessieCatalog | None = None) -> BranchState:
    """Live objects and links (tombstones left out) and the event-id multiset of ``ref``."""
    cat = (catalog or NessieCatalog.from_settings(settings, settings.main_branch)).at(ref)
    ns = settings.namespace
    state = BranchState(ref)
    for row in _scan(cat, ns, ENTITY_EVENTS, ("event_id",)):
        state.event_ids[row["event_id"]] += 1
    common = _scan(cat, ns, ENTITY_COMMON, ("object_type_id", "object_pk", *_ROW))
    state.objects = _live(common, "object_type_id", "object_pk")
    state.links = _live(_scan(cat, ns, ENTITY_EDGE, ("link_type", "link_pk", *_ROW)), "link_type", "link_pk")
    return state


def read_world(settings: Settings, world_id: str, catalog: NessieCatalog | None = None) -> BranchState:
    naming = WorldNaming(settings.prod_world, settings.main_branch)
    return read_branch(settings, naming.branch(world_id), catalog)


def recent_event_ids(
    settings: Settings, branch: str, *, max_commits: int = 20, catalog: NessieCatalog | None = None
) -> list[str]:
    """Event ids of the branch's newest ``max_commits`` batch commits (for Redis mark repair).

    A crash between a Nessie commit and its Redis marks leaves only the newest batches unmarked,
    so re-marking these makes a redelivered copy of their events a plain duplicate again. Raises
    ``TableUnreadable`` when a file the branch's log points at is gone.
    """
    from pyiceberg.expressions import In

    from sinks.committer import PROP_BATCH

    cat = (catalog or NessieCatalog.from_settings(settings, settings.main_branch)).at(branch)
    batch_ids: list[str] = []
    for page in cat.client.history(branch, max_records=min(max_commits, 100)):
        for entry in page:
            if PROP_BATCH in entry.properties:
                batch_ids.append(entry.properties[PROP_BATCH])
        break  # one page: the newest commits are the only ones that can lack marks
    batch_ids = batch_ids[:max_commits]
    if not batch_ids:
        return []
    with unreadable_if_missing(f"{branch}: recent event ids"):
        try:
            tbl = cat.load_table((settings.namespace, ENTITY_EVENTS))
        except NoSuchTableError:
            return []
        wanted = In("batch_id", batch_ids)  # type: ignore[call-arg, arg-type]
        rows = tbl.scan(row_filter=wanted, selected_fields=("event_id",)).to_arrow()
    return rows.column("event_id").to_pylist()
