"""The read half of a merge: the merge base from the commit graph, and each side's changed keys.

**Base.** Merge commits record ``causeway.merge.source`` (the source world) and
``causeway.merge.source_hash`` (the source head merged). The base of merging S into T is the state
recorded by the most recent earlier merge between the two worlds in either direction (S into T: the
source hash it merged, on S; T into S: the hash of T it merged) — like git's merge base after a
merge — and otherwise the fork point: the newest commit of S's history that is also in T's.

**Changed keys.** Each side is diffed against the base with ``worlds.diff_read.diff_table``, which
reads only the data files that differ (a fork shares its files with its base; equal deleted
positions are skipped unread). Its rows are joined on the key (Arrow) to the table of changed keys
that ``worlds.merge.merge`` takes: base state and side state with version, ``occurred_at`` and the
writing event id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table

from worlds.diff_read import TableDiff, diff_table
from worlds.merge import KEY, MergeError, changes_schema

PROP_MERGE_SOURCE = "causeway.merge.source"
PROP_MERGE_SOURCE_HASH = "causeway.merge.source_hash"
PROP_MERGE_BASE = "causeway.merge.base"
PROP_MERGE_TARGET_HEAD = "causeway.merge.target_head"

#: (table, kind, type column, pk column)
PROJECTIONS = (
    ("entity_common", "object", "object_type_id", "object_pk"),
    ("entity_edge", "link", "link_type", "link_pk"),
)
EXTRA = ("updated_at", "event_id")


@dataclass(frozen=True)
class MergeBase:
    hash: str
    ref: str  # the pinned ref to read it at (branch@hash)
    how: str  # fork | merge


def find_base(
    history_source: Any, history_target: Any, source_world: str, target_world: str, *, max_commits: int = 100_000
) -> tuple[str, str] | None:
    """``(hash, on)`` of the merge base, ``on`` = ``source``/``target``: the side whose history holds it.

    ``history_*`` are iterables of Nessie log entries, newest first.
    """
    target_hashes: set[str] = set()
    last_into_target = None  # newest merge source → target, on the target
    for n, entry in enumerate(history_target):
        if n >= max_commits:
            raise MergeError(f"no merge base within {max_commits} commits of {target_world}")
        target_hashes.add(entry.hash)
        if last_into_target is None and entry.properties.get(PROP_MERGE_SOURCE) == source_world:
            last_into_target = entry
    last_into_source = None  # newest merge target → source, on the source
    fork = None
    for n, entry in enumerate(history_source):
        if n >= max_commits:
            break
        if last_into_source is None and entry.properties.get(PROP_MERGE_SOURCE) == target_world:
            last_into_source = entry
        if entry.hash in target_hashes:
            fork = entry.hash
            break
    merges = [
        (e.commit_time, e.properties[PROP_MERGE_SOURCE_HASH], on)
        for e, on in ((last_into_target, "source"), (last_into_source, "target"))
        if e is not None and PROP_MERGE_SOURCE_HASH in e.properties
    ]
    if merges:
        _, hash_, on = max(merges)
        return hash_, on
    if fork is not None:
        return fork, "target"
    return None


@dataclass
class SideChanges:
    """One side's changed keys since the base, per projection table, and what reading them cost."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    diffs: list[TableDiff] = field(default_factory=list)

    def table(self, prefix: str) -> pa.Table:
        parts = [t for t in self.tables.values() if t.num_rows]
        if not parts:
            return changes_schema(prefix).empty_table()
        return pa.concat_tables(parts)

    def stats(self) -> dict[str, Any]:
        return {d.table: d.stats() for d in self.diffs}


def side_changes(base: dict[str, Table | None], side: dict[str, Table | None], prefix: str) -> SideChanges:
    """The changed keys of ``side`` relative to ``base`` (tables by name), as merge change tables."""
    out = SideChanges()
    for name, kind, type_col, pk_col in PROJECTIONS:
        d = diff_table(name, kind, base.get(name), side.get(name), type_col, pk_col, extra_columns=EXTRA)
        out.diffs.append(d)
        out.tables[name] = _changed(kind, d, type_col, pk_col, prefix)
    return out


def _changed(kind: str, d: TableDiff, type_col: str, pk_col: str, prefix: str) -> pa.Table:
    """Join the changed keys with both sides' rows (vectorized); one row per changed key."""
    schema = changes_schema(prefix)
    if not d.changes:
        return schema.empty_table()
    keys = pa.table(
        {
            "kind": pa.array([kind] * len(d.changes), pa.string()),
            "type": pa.array([c.entity_type for c in d.changes], pa.string()),
            "pk": pa.array([c.pk for c in d.changes], pa.string()),
        }
    )
    joined = keys
    for rows, p in ((d.rows_a, "b_"), (d.rows_b, prefix)):
        joined = joined.join(_state_columns(rows, type_col, pk_col, p), ["type", "pk"], join_type="left outer")
    for c in schema.names:
        if c not in joined.column_names:
            joined = joined.append_column(c, pa.nulls(joined.num_rows, schema.field(c).type))
    live_cols = {"b_live", f"{prefix}live"}
    for c in live_cols:
        joined = joined.set_column(joined.column_names.index(c), c, pc.fill_null(joined.column(c), False))
    return _content_changed(joined.select(schema.names).cast(schema), prefix)


def _content_changed(t: pa.Table, prefix: str) -> pa.Table:
    """Drop keys whose content (presence, properties, endpoints) is the base's: a row rewritten with
    another version only (a merge back, a replay) is no change to merge. Vectorized first; only
    rows whose property text differs while both are live are parsed (key order may differ)."""
    if t.num_rows == 0:
        return t

    def same(col: str) -> pa.Array:
        a, b = t.column("b_" + col), t.column(prefix + col)
        return pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))

    live_same = pc.equal(t.column("b_live"), t.column(prefix + "live"))
    ends_same = pc.and_(same("from"), same("to"))
    both_dead = pc.and_(live_same, pc.invert(t.column("b_live")))
    equal = pc.or_(both_dead, pc.and_(pc.and_(live_same, ends_same), same("props")))
    maybe = pc.and_(pc.and_(live_same, ends_same), pc.and_(t.column("b_live"), pc.invert(same("props"))))
    if pc.any(maybe).as_py():
        idx = pc.indices_nonzero(maybe).to_pylist()
        b_props = t.column("b_props").take(idx).to_pylist()
        s_props = t.column(prefix + "props").take(idx).to_pylist()
        flags = equal.to_pylist()
        for i, x, y in zip(idx, b_props, s_props, strict=True):
            flags[i] = orjson.loads(x or "{}") == orjson.loads(y or "{}")
        equal = pa.array(flags, pa.bool_())
    return t.filter(pc.invert(equal))


def _state_columns(rows: pa.Table | None, type_col: str, pk_col: str, p: str) -> pa.Table:
    """``type``, ``pk`` and the state columns of one side's rows, one row per key."""
    if rows is None or rows.num_rows == 0:
        return pa.table({"type": pa.array([], pa.string()), "pk": pa.array([], pa.string())})

    def col(name: str, typ: pa.DataType) -> pa.Array:
        if name in rows.column_names:
            return rows.column(name).cast(typ)
        return pa.nulls(rows.num_rows, typ)

    deleted = pc.fill_null(col("deleted", pa.bool_()), False)
    ts = col("updated_at", pa.timestamp("us", tz="UTC"))
    data = {
        "type": col(type_col, pa.string()),
        "pk": col(pk_col, pa.string()),
        p + "live": pc.invert(deleted),
        p + "props": pc.if_else(deleted, pa.scalar(None, pa.string()), col("properties", pa.string())),
        p + "from": col("from_pk", pa.string()),
        p + "to": col("to_pk", pa.string()),
        p + "version": col("version", pa.int64()),
        p + "ts": pc.divide(ts.cast(pa.int64()), 1000),
        p + "event": col("event_id", pa.string()),
    }
    t = pa.table(data)
    # One row per key (a shared file's rows can be read for both live positions): keep the newest.
    t = t.sort_by([("type", "ascending"), ("pk", "ascending"), (p + "version", "descending")])
    if t.num_rows > 1:
        first = pc.or_(
            pc.not_equal(t.column("type").slice(1), t.column("type").slice(0, t.num_rows - 1)),
            pc.not_equal(t.column("pk").slice(1), t.column("pk").slice(0, t.num_rows - 1)),
        )
        mask = pa.concat_arrays(
            [pa.array([True]), first.combine_chunks() if hasattr(first, "combine_chunks") else first]
        )
        t = t.filter(mask)
    return t


__all__ = ["KEY", "MergeBase", "SideChanges", "find_base", "side_changes"]
