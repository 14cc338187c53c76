"""Table layouts on a world branch: describe a table, and evolve its partition spec and sort order.

The I/O half of :mod:`sinks.layout`. An evolution is one Nessie commit on the world's branch through
the staging catalog (``begin`` pins the head, ``publish`` commits expecting it), like a batch or a
schema change: a concurrent flush that touched the table makes it conflict, and the attempt is
planned again on the new head (where the layout may already be the target: then nothing is
committed). Only metadata changes: existing files keep the spec they were written with, new
writes use the new one, and scans plan each file with its own spec.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.types import IntegerType

from models.worlds import WorldNaming
from sinks.catalog import NessieCatalog
from sinks.committer import BatchCommitter
from sinks.errors import NessieNotFound, RetriesExhausted
from sinks.layout import (
    Evolution,
    Layout,
    LayoutError,
    check,
    format_sort,
    format_spec,
    from_iceberg,
    parse_sort,
    parse_spec,
    part_field,
    plan_evolution,
    sort_columns,
)
from sinks.tables import ALL_TABLES, ENTITY_EVENTS, TableDef
from streams.settings import Settings

PROP_LAYOUT_TABLE = "causeway.layout.table"
PROP_LAYOUT_SPEC = "causeway.layout.spec"
PROP_LAYOUT_SORT = "causeway.layout.sort"
#: Properties a causeway table must carry; an evolution sets the missing ones (see sinks.tables).
REQUIRED_PROPERTIES = {"gc.enabled": "false"}


class TableLayoutError(Exception):
    """A table or world that cannot be shown or evolved (one line for the CLI)."""


class TableMissing(TableLayoutError):
    """The table does not exist on the branch yet (the first commit creates it with its layout)."""


def table_def(name: str) -> TableDef:
    for tdef in ALL_TABLES:
        if tdef.name == name:
            return tdef
    raise TableLayoutError(f"unknown table {name!r} (one of: {', '.join(t.name for t in ALL_TABLES)})")


def current_layout(table: Table) -> Layout:
    schema = table.schema()
    return Layout(from_iceberg(table.spec(), schema), sort_columns(table.sort_order(), schema))


# --- show ---------------------------------------------------------------------------------------------


@dataclass
class PartitionStats:
    partition: str
    spec_id: int
    data_files: int = 0
    rows: int = 0
    delete_files: int = 0
    deleted_rows: int = 0
    bytes: int = 0


@dataclass
class TableReport:
    """What ``causeway tables show`` prints for one table."""

    world: str
    branch: str
    table: str
    schema: list[dict[str, Any]]
    specs: list[dict[str, Any]]  # every spec the table had, oldest first; "default" marks the current
    sort_order: str
    snapshots: int
    data_files: int
    rows: int
    delete_files: int
    deleted_rows: int
    properties: dict[str, str]
    partitions: list[PartitionStats] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def describe(table: Table, world: str, branch: str) -> TableReport:
    """Schema, spec history, sort order, snapshot count and file/row counts per partition."""
    md = table.metadata
    schema = table.schema()
    specs = [
        {"spec_id": sid, "spec": format_spec(from_iceberg(spec, schema)), "default": sid == md.default_spec_id}
        for sid, spec in sorted(table.specs().items())
    ]
    report = TableReport(
        world=world,
        branch=branch,
        table=table.name()[-1],
        schema=[
            {"id": f.field_id, "name": f.name, "type": str(f.field_type), "required": f.required} for f in schema.fields
        ],
        specs=specs,
        sort_order=format_sort(sort_columns(table.sort_order(), schema)),
        snapshots=len(md.snapshots),
        data_files=0,
        rows=0,
        delete_files=0,
        deleted_rows=0,
        properties={k: v for k, v in sorted(md.properties.items()) if not k.startswith("causeway.")},
    )
    if table.current_snapshot() is None:
        return report
    parts: dict[tuple[int, str], PartitionStats] = {}
    seen_deletes: set[str] = set()
    of_file: dict[str, PartitionStats] = {}  # live data file -> its partition's stats
    all_specs = table.specs()
    for task in table.scan().plan_files():
        df = task.file
        spec_id = df.spec_id or 0
        name = _partition_name(all_specs[spec_id], df.partition, schema)
        st = parts.setdefault((spec_id, name), PartitionStats(name, spec_id))
        st.data_files += 1
        st.rows += df.record_count
        st.bytes += df.file_size_in_bytes
        of_file[df.file_path] = st
        for d in task.delete_files:
            if d.file_path not in seen_deletes:
                seen_deletes.add(d.file_path)
                st.delete_files += 1
    # Deleted rows: positions that name a live data file (a delete file may also name files that
    # compaction has removed since; those positions delete nothing). Delete files are small.
    for path in seen_deletes:
        with table.io.new_input(path).open() as f:
            named = pq.read_table(f, columns=["file_path"]).column("file_path")
        for entry in pc.value_counts(named).to_pylist():
            if entry["values"] in of_file:
                of_file[entry["values"]].deleted_rows += entry["counts"]
    report.partitions = [parts[k] for k in sorted(parts)]
    report.data_files = sum(p.data_files for p in report.partitions)
    report.rows = sum(p.rows for p in report.partitions)
    report.delete_files = sum(p.delete_files for p in report.partitions)
    report.deleted_rows = sum(p.deleted_rows for p in report.partitions)
    return report


def _partition_name(spec: Any, partition: Any, schema: Any) -> str:
    if spec.is_unpartitioned():
        return "(unpartitioned)"
    return str(spec.partition_to_path(partition, schema))


# --- evolve -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvolveResult:
    world: str
    branch: str
    table: str
    evolution: Evolution
    dry_run: bool
    commit: str | None = None  # the Nessie commit, None when nothing was committed
    base: str | None = None
    attempts: int = 1
    properties_set: Mapping[str, str] = field(default_factory=dict)
    columns_added: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.evolution.changed or bool(self.properties_set) or bool(self.columns_added)


class TableLayouts:
    """Show and evolve table layouts on world branches (blocking; pyiceberg and Nessie REST)."""

    def __init__(self, settings: Settings, committer: BatchCommitter | None = None) -> None:
        self.settings = settings
        self.committer = committer or BatchCommitter(settings)
        self.client = self.committer.client
        self.naming = WorldNaming(settings.prod_world, settings.main_branch)

    def _branch(self, world: str) -> str:
        branch = self.naming.branch(world)
        try:
            self.client.get_reference(branch)
        except NessieNotFound:
            raise TableLayoutError(f"world {world} has no branch {branch}") from None
        return branch

    def _load(self, cat: NessieCatalog, name: str) -> Table:
        table_def(name)
        try:
            return cat.load_table((self.settings.namespace, name))
        except NoSuchTableError:
            raise TableMissing(
                f"table {name} does not exist on {cat.branch} yet (it is created by the first commit)"
            ) from None

    def show(self, world: str, tables: list[str] | None = None) -> list[TableReport]:
        branch = self._branch(world)
        cat = self.committer.catalog(f"{branch}@{self.client.get_reference(branch).hash}")
        names = tables or [t.name for t in ALL_TABLES]
        out = []
        for name in names:
            try:
                out.append(describe(self._load(cat, name), world, branch))
            except TableLayoutError:
                if tables:  # asked for by name: say it is missing
                    raise
        return out

    def evolve_text(
        self, world: str, table: str, spec: str | None, sort: str | None, dry_run: bool = False
    ) -> EvolveResult:
        """:meth:`evolve` with the layout as text (``default`` = the standard layout with
        ``Settings.projection_buckets``): the one entry point of ``causeway tables evolve`` and of
        the schema-sync control event (``agents.layout_events``). Raises LayoutError on bad text."""
        buckets = self.settings.projection_buckets
        new_spec = parse_spec(spec, table, buckets) if spec is not None else None
        new_sort = parse_sort(sort, table) if sort is not None else None
        return self.evolve(world, table, new_spec, new_sort, dry_run=dry_run)

    def evolve(
        self, world: str, table: str, spec: tuple[Any, ...] | None, sort: tuple[str, ...] | None, dry_run: bool = False
    ) -> EvolveResult:
        """Move ``table`` to ``spec`` / ``sort`` (None keeps the current one) in one Nessie commit."""
        branch = self._branch(world)

        def attempt(cat: NessieCatalog, base: str, n: int) -> EvolveResult:
            # No lookup: an unknown outcome is planned again; an evolution that landed shows as
            # "nothing to do" on the new head.
            return self._attempt(cat, world, branch, table, spec, sort, dry_run, base, n)

        try:
            return self.committer.occ.run(branch, attempt, what=f"evolving {table} on {branch}")
        except RetriesExhausted as exc:
            raise TableLayoutError(str(exc)) from exc

    def _attempt(
        self,
        cat: NessieCatalog,
        world: str,
        branch: str,
        name: str,
        spec: tuple[Any, ...] | None,
        sort: tuple[str, ...] | None,
        dry_run: bool,
        base: str,
        attempt: int,
    ) -> EvolveResult:
        t = self._load(cat, name)
        old = current_layout(t)
        new = Layout(old.spec if spec is None else spec, old.sort if sort is None else sort)
        try:
            check(new.spec, new.sort, t.schema())
        except LayoutError as exc:
            raise TableLayoutError(str(exc)) from None
        evo = plan_evolution(old, new)
        props = {k: v for k, v in REQUIRED_PROPERTIES.items() if t.metadata.properties.get(k) != v}
        # The log's batch order column: rows written after a sort or a new spec need it to keep
        # their batch order (rows written before have their physical order).
        columns = ("batch_seq",) if name == ENTITY_EVENTS and "batch_seq" not in t.schema().column_names else ()
        result = EvolveResult(world, branch, name, evo, dry_run, None, base, attempt, props, columns)
        if dry_run or not result.changed:
            return result
        tx = t.transaction()
        if columns:
            with tx.update_schema() as us:
                us.add_column(
                    "batch_seq", IntegerType(), doc="position in its batch: the log's order within one commit"
                )
        if evo.spec_changed:
            with tx.update_spec() as up:
                for f in evo.remove:
                    up.remove_field(_field_name(t, f))
                for f in evo.add:
                    up.add_field(f.column, f.iceberg(), f.name)
        if evo.sort_changed and not new.sort:
            # Back to unsorted: pyiceberg's sort-order builder emits "set the order just added" with
            # nothing added (ValueError). The unsorted order (id 0) is set directly, added first when
            # the table was created sorted and never held it.
            from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, UNSORTED_SORT_ORDER_ID
            from pyiceberg.table.update import AddSortOrderUpdate, SetDefaultSortOrderUpdate

            add = (
                ()
                if any(o.order_id == UNSORTED_SORT_ORDER_ID for o in t.metadata.sort_orders)
                else (AddSortOrderUpdate.model_validate({"sort-order": UNSORTED_SORT_ORDER}),)
            )
            tx._apply((*add, SetDefaultSortOrderUpdate.model_validate({"sort-order-id": UNSORTED_SORT_ORDER_ID})))
        elif evo.sort_changed:
            with tx.update_sort_order() as so:
                for col in new.sort:
                    so.asc(col, _identity())
        if props:
            tx.set_properties(props)
        tx.commit_transaction()
        published = cat.publish(
            f"causeway: evolve {name} of world {world}: {format_spec(new.spec)}; sorted by {format_sort(new.sort)}",
            {
                "causeway.world": world,
                "causeway.batch_id": f"layout:{uuid.uuid4().hex}",
                PROP_LAYOUT_TABLE: name,
                PROP_LAYOUT_SPEC: format_spec(new.spec),
                PROP_LAYOUT_SORT: format_sort(new.sort),
            },
        )
        return EvolveResult(world, branch, name, evo, False, published.hash, base, attempt, props, columns)


def _field_name(table: Table, f: Any) -> str:
    """The name the table gave a partition field (it may predate causeway's naming)."""
    schema = table.schema()
    for pf in table.spec().fields:
        if part_field(pf, schema) == f:
            return pf.name
    return f.name


def _identity() -> Any:
    from pyiceberg.transforms import IdentityTransform

    return IdentityTransform()
