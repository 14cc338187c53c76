"""The Iceberg tables of a world branch: the event log and the two projections.

* ``entity_events`` — append-only log, one row per applied (or stale) event.
* ``entity_common`` — objects, one live row per ``(object_type_id, object_pk)``.
* ``entity_edge`` — links, one live row per ``(link_type, link_pk)``.

Properties are stored as JSON text (``properties``); typed property columns are added later by
schema evolution (schema sync), which is why the projections are read by column *name* and the
key columns never change. A deleted entity stays as a tombstone row (``deleted = true``) that
keeps its version, so a late, older event cannot resurrect it; readers filter ``not deleted``.

The projections are unpartitioned on purpose: the committer changes rows with positional delete
files plus a pk index (see ``sinks.committer``), which keeps a flush's rewritten bytes bounded
without partitioning; a bucket spec would only multiply small files.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

ENTITY_EVENTS = "entity_events"
ENTITY_COMMON = "entity_common"
ENTITY_EDGE = "entity_edge"

#: Table property holding the cumulative committed-offset summary (JSON, see sinks.offsets).
OFFSETS_PROPERTY = "causeway.committed-offsets"


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

# Unpartitioned: a day(committed_at) spec needs pyiceberg-core for the transform on write, which
# is not a dependency yet; append-only writes have no rewrite cost either way.
EVENTS_SPEC = PartitionSpec()


@dataclass(frozen=True)
class TableDef:
    """One table: name, schema, spec, and the key columns of a projection (empty for the log)."""

    name: str
    schema: Schema
    spec: PartitionSpec
    key: tuple[str, str] = ("", "")

    @property
    def arrow_schema(self) -> pa.Schema:
        return self.schema.as_arrow()


EVENTS = TableDef(ENTITY_EVENTS, EVENTS_SCHEMA, EVENTS_SPEC)
COMMON = TableDef(ENTITY_COMMON, COMMON_SCHEMA, PartitionSpec(), ("object_type_id", "object_pk"))
EDGE = TableDef(ENTITY_EDGE, EDGE_SCHEMA, PartitionSpec(), ("link_type", "link_pk"))
ALL_TABLES = (EVENTS, COMMON, EDGE)


def table_properties(target_file_bytes: int) -> dict[str, str]:
    """Properties every causeway table gets.

    ``write.target-file-size-bytes`` sizes files by bytes (pyiceberg measures in-memory Arrow
    bytes, so on-disk files come out smaller). Old metadata files are *not* deleted after commit:
    other branches may still point at them; Nessie GC owns physical deletion.
    """
    return {
        "format-version": "2",
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
