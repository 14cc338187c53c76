"""Overwrite whole tables on a branch in one Nessie commit, through the one commit loop.

For writers that replace a table's rows wholesale rather than apply change events (``causeway
rebuild`` writes the projections folded from the event log onto its rebuild branch). Rows are
given as dicts under the table's definition; typed property columns added by schema evolution are
filled from the JSON properties with the contracts recorded on the table, as the live committer
fills them. A missing table is created with the layout the settings configure, as the committer
creates it (``sinks.tables.create_table``), and the rows are written in the table's sort order.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.transforms import IdentityTransform

from sinks.catalog import NessieCatalog
from sinks.nessie import SyncNessieClient
from sinks.occ import Occ
from sinks.rows import typed_columns
from sinks.tables import TableDef, contracts, create_table
from streams.settings import Settings

Row = dict[str, Any]


def overwrite_tables(
    settings: Settings,
    client: SyncNessieClient,
    branch: str,
    tables: Sequence[tuple[TableDef, Sequence[Row]]],
    *,
    message: str,
    properties: Mapping[str, str],
    id_property: str,
) -> str:
    """Replace every row of each table (created if missing and given rows) in one commit; its hash.

    ``properties[id_property]`` is the writer's commit id: an unknown outcome is looked up by it.
    """

    def attempt(cat: NessieCatalog, base: str, n: int) -> str:
        for tdef, rows in tables:
            try:
                table = cat.load_table((settings.namespace, tdef.name))
            except NoSuchTableError:
                if not rows:
                    continue
                table = create_table(
                    cat, settings.namespace, tdef, settings.projection_buckets, settings.target_file_bytes
                )
            tx = table.transaction()
            with warnings.catch_warnings():
                # pyiceberg notes it rewrites instead of merge-on-read: a full overwrite is meant.
                warnings.filterwarnings("ignore", "Merge on read is not yet supported", UserWarning)
                data = _arrow(table, tdef, list(rows))
                # pyiceberg writes rows in the order given; the table says how its files are sorted.
                tx.overwrite(in_sort_order(data, table.sort_order(), table.schema()))
            tx.commit_transaction()
        return cat.publish(message, dict(properties)).hash

    occ = Occ.from_settings(settings, client)
    commit_id = properties[id_property]
    return occ.run(
        branch,
        attempt,
        what=f"overwrite of {', '.join(t.name for t, _ in tables)} on {branch}",
        commit_id=commit_id,
        id_property=id_property,
        landed=lambda h, _n: h,
    )


def in_sort_order(data: pa.Table, order: SortOrder, schema: Schema) -> pa.Table:
    """``data`` sorted by ``order``'s leading identity fields (direction and null order kept).

    A field with another transform (bucket, truncate, ...) ends the keys: its order is that of a
    derived value, and sorting by the fields after it alone would not be the table's order.
    """
    keys = []
    for f in order.fields:
        name = schema.find_column_name(f.source_id)
        if not isinstance(f.transform, IdentityTransform) or name not in data.column_names:
            break
        direction = "ascending" if f.direction == SortDirection.ASC else "descending"
        keys.append((name, direction, "at_start" if f.null_order == NullOrder.NULLS_FIRST else "at_end"))
    if not keys or data.num_rows < 2:
        return data
    return data.take(pc.sort_indices(data, sort_keys=keys))


@dataclass(frozen=True)
class _Props:
    """A row as ``sinks.rows.typed_columns`` reads it."""

    entity_type: str
    after: dict[str, Any] | None


def _arrow(table: Table, tdef: TableDef, rows: list[Row]) -> pa.Table:
    """The rows under the table's *current* schema (typed property columns filled from the JSON)."""
    base = pa.Table.from_pylist(rows, schema=tdef.arrow_schema)
    schema = table.schema().as_arrow()
    extra = [n for n in schema.names if n not in base.column_names]
    typed: dict[str, pa.Array] = {}
    if extra and rows:
        props = [_Props(r[tdef.key[0]], orjson.loads(r["properties"]) if r["properties"] else None) for r in rows]
        deleted = [r["deleted"] for r in rows]
        typed = typed_columns(schema, contracts(table.metadata.properties), props, deleted)
    cols = {
        n: base.column(n) if n in base.column_names else typed.get(n, pa.nulls(len(rows), schema.field(n).type))
        for n in schema.names
    }
    return pa.table(cols, schema=schema)
