"""One flush's projection write (``entity_common`` / ``entity_edge``), merge-on-read.

Reads the stored ``(version, deleted)`` of every touched key at the pinned head, lets
:func:`sinks.projection.plan` decide the rows, writes the new row versions to new data files,
masks the replaced rows with one position-delete file per partition, applies the compaction
policy (:mod:`sinks.compaction`) and commits it all as one snapshot (:class:`sinks.rowdelta.RowDelta`)
in the table's transaction, staged for the batch's one Nessie commit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import AddPartitionSpecUpdate

from models.events import ChangeEvent
from sinks import projection
from sinks.attempt_files import AttemptFiles, write_key
from sinks.compaction import Compaction, Rewrites
from sinks.flush_stats import FlushStats
from sinks.layout import key_filter, unpartitioned_spec, writes_one_file
from sinks.rowdelta import (
    FileCache,
    PartitionSplit,
    RowDelta,
    deletes_to_merge,
    joined,
    read_state,
    split_rows,
    write_partition_deletes,
    write_split,
)
from sinks.rows import projection_arrow
from sinks.tables import SCHEMA_PROPERTY_PREFIX, TableDef, arrow_schema, contracts


def carry_stored_properties(table: Table, tdef: TableDef, plan: projection.Plan, keys: set[projection.Key]) -> None:
    """Fill events' unchanged properties from the stored rows of ``keys`` (read only for them)."""
    type_col, pk_col = tdef.key
    pks = pa.array(sorted({pk for _, pk in keys}), pa.string())
    state = read_state(
        table,
        [type_col, pk_col, "version", "properties"],
        lambda t: pc.is_in(t.column(pk_col), value_set=pks),
        None,
        key_filter(type_col, pk_col, keys),
    )
    if state.index is None:
        return
    best: dict[projection.Key, tuple[int, str | None]] = {}
    for t_, pk, version, props in zip(
        *(state.index.column(c).to_pylist() for c in (type_col, pk_col, "version", "properties")), strict=True
    ):
        if (t_, pk) in keys and ((t_, pk) not in best or version > best[(t_, pk)][0]):
            best[(t_, pk)] = (version, props)
    for key, (_, props) in best.items():
        if props:
            plan.rows[key] = projection.carry_unchanged(plan.rows[key], orjson.loads(props))


def _index_columns(tdef: TableDef) -> tuple[str, ...]:
    """The columns of the key index (what a flush reads of every data file it may touch)."""
    type_col, pk_col = tdef.key
    return (type_col, pk_col, "version", "deleted")


def _write_batches(
    metadata: TableMetadata, rows: pa.Table, rewrites: Rewrites, small_file_bytes: int
) -> tuple[list[PartitionSplit], PartitionSpec | None]:
    """What a flush writes, split by partition: its new ``rows`` and the live rows of the files it
    rewrites; and the unpartitioned spec to add to the table first, if any.

    A small flush that would write a file per partition writes its rows as one file under the
    unpartitioned spec, added to the table's specs (not as default) the first time
    (:func:`sinks.layout.writes_one_file` says why). The live rows of the files that
    :meth:`sinks.compaction.Compaction.picks` rewrites with the flush (``rewrites.with_flush``:
    earlier one-file flushes that this flush left sparse) are written with the flush's rows, in
    its one file when it writes one. The other rewritten rows (``rewrites.by_partition``) go to
    the default spec: the small-file merge is what moves those one-file flushes into their
    partitions. The rows' split under the default spec both counts their partitions and is what
    the writer writes: cut once, not once to count and again to write.
    """
    spec, schema = metadata.spec(), metadata.schema()
    fresh = pa.concat_tables([rows, *rewrites.with_flush]) if rewrites.with_flush else rows
    split = split_rows(fresh, spec, schema)
    rest = rewrites.by_partition
    others = [split_rows(pa.concat_tables(rest) if len(rest) > 1 else rest[0], spec, schema)] if rest else []
    if not writes_one_file(spec, split.partitions, fresh.nbytes, small_file_bytes):
        return [joined(split, *others) if others else split], None
    one = unpartitioned_spec(metadata.specs())
    return [split_rows(fresh, one, schema), *others], None if one.spec_id in metadata.specs() else one


@dataclass(frozen=True)
class _Written:
    """What a flush wrote of its new rows (and the rows it carried from rewritten files)."""

    files: list[tuple[DataFile, pa.Table]]
    new_spec: PartitionSpec | None
    rows_written: int
    unconverted: int
    data_rows: int


def apply_projection(
    table: Table,
    tdef: TableDef,
    events: list[ChangeEvent],
    batch_id: str,
    now: datetime,
    cache: FileCache,
    policy: Compaction,
    files: AttemptFiles | None = None,
) -> tuple[FlushStats, set[str]]:
    """Stage the batch's ``events`` on ``table`` in a transaction of its own; returns the flush's
    costs and the ids of the events the version rule refused. ``files``: what earlier attempts of
    the batch wrote (a retry writing the same rows takes their files)."""
    type_col, pk_col = tdef.key
    keys, types = projection.touched(events)
    pks = pa.array(sorted({pk for _, pk in keys}), pa.string())
    type_values = pa.array(sorted(types), pa.string())

    def match(t: pa.Table) -> pa.Array:
        mask = pc.is_in(t.column(pk_col), value_set=pks)
        if len(type_values):
            mask = pc.or_(mask, pc.is_in(t.column(type_col), value_set=type_values))
        return mask

    scan = key_filter(type_col, pk_col, keys, types)  # prunes to the touched (type, bucket) partitions
    state = read_state(table, list(_index_columns(tdef)), match, cache, scan)
    stats = FlushStats(bytes_read=state.bytes_read)
    stored: dict[projection.Key, projection.Stored] = {}
    where: dict[projection.Key, list[tuple[str, int]]] = {}
    if state.index is not None:
        for t_, pk, version, deleted, pos, path in zip(
            *(state.index.column(c).to_pylist() for c in (type_col, pk_col, "version", "deleted", "_pos", "_file")),
            strict=True,
        ):
            key = (t_, pk)
            where.setdefault(key, []).append((path, pos))
            prev = stored.get(key)
            if prev is None or version > prev.version:
                stored[key] = projection.Stored(version, deleted)
    plan = projection.plan(events, stored)
    stale = {e.event_id for e in plan.stale}
    if not plan.changed:
        return stats, stale

    missing = projection.needs_stored_properties(plan) & set(stored)
    if missing:
        carry_stored_properties(table, tdef, plan, missing)

    new_deletes: dict[str, list[int]] = {}
    for key in plan.remove:
        for path, pos in where.get(key, ()):
            new_deletes.setdefault(path, []).append(pos)
    stats.rows_deleted = sum(len(v) for v in new_deletes.values())

    rewrites = policy.rewrites(table, state, new_deletes, stats, cache)
    to_remove = rewrites.remove

    tx = table.transaction()
    rd = RowDelta(tx, {"causeway.batch_id": batch_id})
    metadata = tx.table_metadata

    def write() -> _Written:
        # Typed columns follow the table's schema *at this head* (schema sync may have evolved it
        # since the last attempt) and the contracts recorded with it.
        unconverted: Counter[str] = Counter()
        rows = projection_arrow(
            tdef,
            list(plan.rows.values()),
            batch_id,
            now,
            arrow_schema(table.schema()),
            contracts(table.metadata.properties),
            unconverted,
        )
        batches, new_spec = _write_batches(metadata, rows, rewrites, policy.small_file_bytes)
        if new_spec is not None:
            tx._apply((AddPartitionSpecUpdate(spec=new_spec),))
        written = [w for split in batches for w in write_split(tx.table_metadata, split, table.io)]
        return _Written(written, new_spec, rows.num_rows, sum(unconverted.values()), sum(b.num_rows for b in batches))

    # The rows written depend on the head only through the plan (which events' rows), the metadata
    # they are written under, the schema contracts (the typed columns) and the rows carried from
    # rewritten files: which files, and their deleted positions (a live file's deletes only grow
    # along a branch, so their count names them). Not kept with properties carried from stored rows.
    written_from = (
        tdef.name,
        write_key(metadata),
        now,  # the rows' committed_at
        tuple(sorted((k, v) for k, v in metadata.properties.items() if k.startswith(SCHEMA_PROPERTY_PREFIX))),
        tuple(ev.event_id for ev in plan.rows.values()),
        tuple((p, len(state.files[p].deleted), tuple(sorted(new_deletes.get(p, ())))) for p in rewrites.remove),
        tuple(t.num_rows for t in rewrites.with_flush),
    )
    if missing or files is None:
        out = write()
    elif written_from in files:
        out = files.written(written_from, write)
        if out.new_spec is not None:  # what ``write`` staged the first time
            tx._apply((AddPartitionSpecUpdate(spec=out.new_spec),))
    else:
        out = files.written(written_from, write)
    stats.values_unconverted = out.unconverted
    stats.rows_written = out.rows_written
    data_rows = out.data_rows
    if data_rows:
        written_rows = out.files
        files_added = [f for f, _ in written_rows]
        index_columns = _index_columns(tdef)
        for f, file_rows in written_rows:  # the next flush's key lookup reads these files: keep them
            if f.file_size_in_bytes < policy.small_file_bytes:  # and a later small-file merge reads all of it
                file_rows = cache.seed_rows(f.file_path, file_rows)  # copied once, for both entries
            cache.seed(f.file_path, index_columns, file_rows.select(list(index_columns)))
            cache.seed_filter(f.file_path, pk_col, file_rows.column(pk_col))  # which keys it may hold
        rd.add(files_added)
        new_bytes = sum(f.file_size_in_bytes for f in files_added)
        stats.bytes_written += new_bytes
        stats.files_added += len(files_added)
        if stats.rows_rewritten:
            stats.bytes_rewritten += int(new_bytes * stats.rows_rewritten / data_rows)
    rd.remove(state.files[p].data_file for p in to_remove)
    cache.forget(to_remove)
    stats.files_removed += len(to_remove)

    # Delete files: drop those that name no surviving data file; when there are too many,
    # merge the smaller half (tiered, like an LSM) so a merge rewrites recent deletes, not all.
    removed = set(to_remove)
    surviving_files = set(state.files) - removed
    survivors = {p: list(v) for p, v in new_deletes.items() if p not in removed}
    obsolete = [state.delete_files[d] for d, refs in state.delete_positions.items() if not set(refs) & surviving_files]
    gone = {df.file_path for df in obsolete}
    live_deletes = [d for d in state.delete_files if d not in gone]
    merge = deletes_to_merge(state.delete_files, live_deletes, policy.max_delete_files)  # per partition
    for d in merge:
        for path, pos in state.delete_positions[d].items():
            if path not in removed and path in state.files:
                survivors.setdefault(path, []).extend(pos.to_pylist())
        obsolete.append(state.delete_files[d])
    rd.remove(obsolete)
    cache.forget(d.file_path for d in obsolete)
    stats.files_removed += len(obsolete)
    if survivors:  # one delete file per partition: deletes never cross a partition
        dfiles = write_partition_deletes(table, state.files, survivors, cache)
        rd.add(dfiles)
        stats.files_added += len(dfiles)
        written = sum(d.file_size_in_bytes for d in dfiles)
        stats.bytes_written += written
        if merge and dfiles:  # the share of the files that carries positions already stored
            carried_pos = sum(state.delete_files[d].record_count for d in merge)
            stats.bytes_rewritten += written * carried_pos // max(1, sum(d.record_count for d in dfiles))
    if not rd.empty:
        rd.commit()
    policy.expire(tx)
    tx.commit_transaction()
    return stats, stale
