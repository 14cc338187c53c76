"""The Iceberg tables of a world branch: the event log and the two projections.

* ``entity_events`` — append-only log, one row per applied (or stale) event.
* ``entity_common`` — objects, one live row per ``(object_type_id, object_pk)``.
* ``entity_edge`` — links, one live row per ``(link_type, link_pk)``.

Properties are stored twice in the projections: as JSON text (``properties``, the lossless
catch-all: every property an event carried, known to the schema or not) and, for the properties
the world's schema contract defines (``models.schema``), as typed columns ``p_<type>__<name>``
that schema sync adds by Iceberg schema evolution. Which column holds which property is recorded
in the table property ``causeway.schema.<type>`` (a ``TypeSchema`` as JSON) in the same commit
as the evolution, so writers and readers resolve a column by property id, never by guessing from
names; the key columns never change. See docs/schema.md for the layout decision.

A deleted entity stays as a tombstone row (``deleted = true``) that keeps its version, so a late,
older event cannot resurrect it; readers filter ``not deleted``.

Layouts (``sinks.layout``, justified in docs/architecture.md "Table layout"): the log is
partitioned by ``day(occurred_at)`` and its files are sorted by ``(entity_type, entity_pk,
version)``; the projections are partitioned by type, and by ``bucket(N, pk)`` when N =
``Settings.projection_buckets`` > 0 (0, type only, by default), and sorted by key, so a flush reads
and rewrites only the partitions it touches. Every writer creates a missing table through
:func:`create_table`, so a table gets the layout the settings configure whoever creates it.
Tables created before these layouts keep theirs until ``causeway tables evolve`` moves them
(Iceberg partition evolution: metadata only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import SortOrder
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)

from models.events import EntityKind
from models.schema import AddColumn, ColumnOp, DocColumn, Primitive, PropType, RenameColumn, TypeSchema, WidenColumn
from sinks.layout import DEFAULT_LAYOUTS, PROJECTION_BUCKETS, Layout, default_layout, partition_spec, sort_order

ENTITY_EVENTS = "entity_events"
ENTITY_COMMON = "entity_common"
ENTITY_EDGE = "entity_edge"

#: Table property holding the cumulative committed-offset summary (JSON, see sinks.committed_offsets).
OFFSETS_PROPERTY = "causeway.committed-offsets"
#: Table property of ``entity_events``: the ``<kind>/<type>`` pairs a TRUNCATE ever cleared on the
#: branch, each with its version ceiling (the highest version a truncate of it removed), as a JSON
#: object. Absent on branches written before it (then read from the log once); a JSON list of the
#: pairs on branches written before the ceilings (then each ceiling is read from the log once).
TRUNCATED_PROPERTY = "causeway.truncated-types"
#: Prefix of the table properties holding each type's applied schema contract (TypeSchema JSON).
SCHEMA_PROPERTY_PREFIX = "causeway.schema."


#: Arrow schemas by the Iceberg fields they were converted from (bounded; a worker sees a few
#: schema versions per table).
_ARROW: dict[tuple[NestedField, ...], pa.Schema] = {}
_ARROW_MAX = 256


def arrow_schema(schema: Schema) -> pa.Schema:
    """``schema.as_arrow()``, converted once per distinct set of fields.

    pyiceberg converts the whole schema on every call (~0.7 ms for the log's 23 columns) and a
    commit asked ~17 times (row building, the writer, the kept-rows checks of compaction); Arrow
    schemas are immutable, so one is shared. The fields (ids, names, types, required, doc) are all
    a conversion reads.
    """
    key = tuple(schema.fields)
    found = _ARROW.get(key)
    if found is None:
        found = schema.as_arrow()
        if len(_ARROW) >= _ARROW_MAX:
            _ARROW.clear()
        _ARROW[key] = found
    return found


def _f(fid: int, name: str, typ: object, required: bool = False, doc: str | None = None) -> NestedField:
    return NestedField(field_id=fid, name=name, field_type=typ, required=required, doc=doc)  # type: ignore[arg-type]


EVENTS_SCHEMA = Schema(
    _f(1, "event_id", StringType(), True, "unique idempotency key"),
    _f(2, "world_id", StringType(), True),
    _f(3, "kind", StringType(), True, "object | link"),
    _f(4, "entity_type", StringType(), True, "object_type or link_type"),
    _f(5, "entity_pk", StringType(), True, "object_pk or link_pk; '*' for TRUNCATE"),
    _f(6, "change_type", StringType(), True),
    _f(7, "version", LongType(), True),
    _f(8, "before_properties", StringType(), False, "JSON"),
    _f(9, "after_properties", StringType(), False, "JSON"),
    _f(10, "caused_by", StringType()),
    _f(11, "causal_order", LongType()),
    _f(12, "occurred_at", TimestamptzType(), True),
    _f(13, "committed_at", TimestamptzType(), True),
    _f(14, "batch_id", StringType(), True),
    _f(15, "schema_version", IntegerType(), True),
    _f(16, "source", StringType()),
    _f(17, "from_pk", StringType()),
    _f(18, "to_pk", StringType()),
    _f(19, "source_topic", StringType()),
    _f(20, "source_partition", IntegerType()),
    _f(21, "source_offset", LongType()),
    _f(22, "applied", BooleanType(), True, "false when the projection ignored it as stale"),
    _f(23, "batch_seq", IntegerType(), False, "position in its batch: the log's order within one commit"),
    identifier_field_ids=[],
)

COMMON_SCHEMA = Schema(
    _f(1, "object_type_id", StringType(), True),
    _f(2, "object_pk", StringType(), True),
    _f(3, "version", LongType(), True),
    _f(4, "properties", StringType(), False, "JSON; null for a tombstone"),
    _f(5, "deleted", BooleanType(), True),
    _f(6, "updated_at", TimestamptzType(), True, "occurred_at of the event that wrote the row"),
    _f(7, "committed_at", TimestamptzType(), True),
    _f(8, "event_id", StringType(), True, "the event that wrote the row"),
    _f(9, "batch_id", StringType(), True),
    _f(10, "schema_version", IntegerType(), True),
)

EDGE_SCHEMA = Schema(
    _f(1, "link_type", StringType(), True),
    _f(2, "link_pk", StringType(), True),
    _f(3, "from_pk", StringType()),
    _f(4, "to_pk", StringType()),
    _f(5, "version", LongType(), True),
    _f(6, "properties", StringType(), False, "JSON; null for a tombstone"),
    _f(7, "deleted", BooleanType(), True),
    _f(8, "updated_at", TimestamptzType(), True),
    _f(9, "committed_at", TimestamptzType(), True),
    _f(10, "event_id", StringType(), True),
    _f(11, "batch_id", StringType(), True),
    _f(12, "schema_version", IntegerType(), True),
)


@dataclass(frozen=True)
class TableDef:
    """One table: name, schema, the key columns of a projection (empty for the log), and the layout
    a new table is created with (partition spec and sort order, see ``sinks.layout``)."""

    name: str
    schema: Schema
    key: tuple[str, str] = ("", "")

    @property
    def arrow_schema(self) -> pa.Schema:
        return arrow_schema(self.schema)

    @property
    def layout(self) -> Layout:
        return DEFAULT_LAYOUTS[self.name]

    @property
    def spec(self) -> PartitionSpec:
        return partition_spec(self.layout.spec, self.schema)

    def spec_with(self, buckets: int = PROJECTION_BUCKETS) -> PartitionSpec:
        """The spec a new table gets with ``buckets`` buckets of its key (``Settings.projection_buckets``)."""
        return partition_spec(default_layout(self.name, buckets).spec, self.schema)

    @property
    def sort_order(self) -> SortOrder:
        return sort_order(self.layout.sort, self.schema)


EVENTS = TableDef(ENTITY_EVENTS, EVENTS_SCHEMA)
COMMON = TableDef(ENTITY_COMMON, COMMON_SCHEMA, ("object_type_id", "object_pk"))
EDGE = TableDef(ENTITY_EDGE, EDGE_SCHEMA, ("link_type", "link_pk"))
ALL_TABLES = (EVENTS, COMMON, EDGE)


def table_properties(target_file_bytes: int) -> dict[str, str]:
    """Properties every causeway table gets.

    ``write.target-file-size-bytes`` sizes files by bytes (pyiceberg measures in-memory Arrow
    bytes, so on-disk files come out smaller). Old metadata files are *not* deleted after commit:
    other branches may still point at them; Nessie GC owns physical deletion. ``gc.enabled=false``
    (Iceberg's recommendation for Nessie-managed tables) makes engines that honour it (Spark's
    ``expire_snapshots`` / ``remove_orphan_files``) refuse to delete files from one branch that
    other worlds may still reference.
    """
    return {
        "format-version": "2",
        "gc.enabled": "false",
        "write.target-file-size-bytes": str(target_file_bytes),
        "write.parquet.compression-codec": "zstd",
        "write.metadata.previous-versions-max": "20",
        "write.metadata.delete-after-commit.enabled": "false",
        "write.delete.mode": "merge-on-read",
        "write.update.mode": "merge-on-read",
        "commit.retry.num-retries": "0",  # the committer retries whole batches itself
        # The log's appends add a manifest each; merge them so the manifest list stays short.
        "commit.manifest-merge.enabled": "true",
        "commit.manifest.min-count-to-merge": "16",
    }


def create_table(
    cat: Catalog, namespace: str, tdef: TableDef, projection_buckets: int, target_file_bytes: int
) -> Table:
    """Create ``tdef`` on ``cat`` (a causeway ``NessieCatalog``) with the layout a new table is
    configured for: its spec with ``projection_buckets`` buckets of a projection's key
    (``Settings.projection_buckets``), its sort order, and :func:`table_properties`.

    The one way a writer creates a table (the committer, a rebuild's overwrite): a writer that
    built the spec itself gave the rebuild's projections the module default's spec and no sort
    order, whatever the world was configured with.
    """
    return cat.create_table(
        (namespace, tdef.name),
        tdef.schema,
        partition_spec=tdef.spec_with(projection_buckets),
        sort_order=tdef.sort_order,
        properties=table_properties(target_file_bytes),
    )


# --- typed property columns -----------------------------------------------------------------------


def projection_for(kind: EntityKind) -> TableDef:
    """The projection table of a kind: ``entity_common`` for objects, ``entity_edge`` for links."""
    return COMMON if kind is EntityKind.OBJECT else EDGE


def iceberg_type(t: PropType) -> IcebergType:
    """The Iceberg type of a property type (``timestamp`` has no zone; ``timestamptz`` is UTC)."""
    simple: dict[Primitive, IcebergType] = {
        Primitive.STRING: StringType(),
        Primitive.INT: IntegerType(),
        Primitive.LONG: LongType(),
        Primitive.FLOAT: FloatType(),
        Primitive.DOUBLE: DoubleType(),
        Primitive.BOOLEAN: BooleanType(),
        Primitive.DATE: DateType(),
        Primitive.TIMESTAMP: TimestampType(),
        Primitive.TIMESTAMPTZ: TimestamptzType(),
    }
    if t.primitive is Primitive.DECIMAL:
        return DecimalType(t.precision, t.scale)
    return simple[t.primitive]


def schema_property(type_name: str) -> str:
    return SCHEMA_PROPERTY_PREFIX + type_name


def contracts(properties: Mapping[str, str]) -> dict[str, TypeSchema]:
    """The applied schema contracts recorded in a projection table's properties, by type name."""
    out: dict[str, TypeSchema] = {}
    for key, value in properties.items():
        if key.startswith(SCHEMA_PROPERTY_PREFIX):
            ts = TypeSchema.from_json(value)
            out[ts.type_name] = ts
    return out


def evolve(update: object, ops: tuple[ColumnOp, ...]) -> None:
    """Carry out column operations on a pyiceberg ``UpdateSchema`` (metadata only, no data rewrite).

    Added columns are optional (old rows read as null until backfilled); widening uses Iceberg's
    type promotion (int→long, float→double, decimal precision up), which readers apply to old files.
    """
    from pyiceberg.table.update.schema import UpdateSchema

    assert isinstance(update, UpdateSchema)
    for op in ops:
        if isinstance(op, AddColumn):
            update.add_column((op.column,), iceberg_type(op.type), doc=op.doc)
        elif isinstance(op, RenameColumn):
            update.rename_column((op.old,), op.new)
        elif isinstance(op, WidenColumn):
            update.update_column((op.column,), field_type=iceberg_type(op.type))
        elif isinstance(op, DocColumn):
            update.update_column((op.column,), doc=op.doc)
