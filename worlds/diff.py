"""Entity-, property- and schema-level diff of two world states (pure: Arrow and schemas in, changes out).

**What is read.** Two snapshots of a projection table share most of their data files (a fork
starts with all of them; a flush adds one file and a delete file). :func:`plan_reads` compares the
two sides' live data files and, per shared file, the positions each side deletes:

* a file on one side only is read whole (its live rows);
* a shared file whose deleted positions are equal on both sides holds the same live rows on both:
  it is skipped, unread;
* a shared file whose deleted positions differ is read once, and only the rows live on one side
  and not the other are kept.

Any entity that differs between the sides has a live row in a file the plan reads (a changed row
is a new row in a new file plus a delete of the old position), so the diff is exact.

**Comparing.** The rows read from each side are joined on the key columns (vectorized, Arrow);
only rows whose version, deletion or properties differ are decoded into property changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema

ADDED, REMOVED, MODIFIED = "added", "removed", "modified"
#: Columns compared besides properties: links also compare their endpoints.
COMPARE_COLUMNS = ("version", "deleted", "properties", "from_pk", "to_pk")


# --- which files to read ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRead:
    """A data file to read and which of its positions each side keeps (None: every live row)."""

    path: str
    a_positions: pa.Array | None = None  # rows live on A only
    b_positions: pa.Array | None = None  # rows live on B only
    whole_a: bool = False
    whole_b: bool = False


@dataclass
class ReadPlan:
    reads: list[FileRead] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def paths(self) -> set[str]:
        return {r.path for r in self.reads}


def _set(values: pa.Array | None) -> pa.Array:
    if values is None or len(values) == 0:
        return pa.array([], pa.int64())
    uniq = pc.unique(values)
    return uniq.take(pc.array_sort_indices(uniq))


def plan_reads(a: Mapping[str, pa.Array | None], b: Mapping[str, pa.Array | None]) -> ReadPlan:
    """``a`` / ``b``: live data file path → positions that side deletes in it. See the module doc."""
    plan = ReadPlan()
    for path in sorted(set(a) | set(b)):
        if path not in b:
            plan.reads.append(FileRead(path, whole_a=True))
            continue
        if path not in a:
            plan.reads.append(FileRead(path, whole_b=True))
            continue
        del_a, del_b = _set(a[path]), _set(b[path])
        if del_a.equals(del_b):
            plan.skipped.append(path)
            continue
        # Deleted on B but not on A: the row is live on A only, and vice versa.
        only_a = pc.filter(del_b, pc.invert(pc.is_in(del_b, value_set=del_a)))
        only_b = pc.filter(del_a, pc.invert(pc.is_in(del_a, value_set=del_b)))
        plan.reads.append(FileRead(path, a_positions=only_a, b_positions=only_b))
    return plan


# --- entity changes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PropertyChange:
    name: str
    before: Any
    after: Any


@dataclass(frozen=True)
class EntityChange:
    kind: str  # object | link
    entity_type: str
    pk: str
    change: str  # added | removed | modified
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    properties: tuple[PropertyChange, ...] = ()
    version_before: int | None = None
    version_after: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "type": self.entity_type,
            "pk": self.pk,
            "change": self.change,
            "version": [self.version_before, self.version_after],
            "properties": {p.name: [p.before, p.after] for p in self.properties},
            "before": self.before,
            "after": self.after,
        }


def property_changes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> tuple[PropertyChange, ...]:
    """Properties whose value differs (a missing property is None), sorted by name."""
    before, after = before or {}, after or {}
    return tuple(
        PropertyChange(name, before.get(name), after.get(name))
        for name in sorted(set(before) | set(after))
        if before.get(name) != after.get(name) or (name in before) != (name in after)
    )


_TYPES = {"version": pa.int64(), "deleted": pa.bool_()}


def _side(rows: pa.Table | None, type_col: str, pk_col: str, suffix: str) -> pa.Table:
    """Key and compared columns of one side with fixed names and types (files may hold large_string)."""
    n = rows.num_rows if rows is not None else 0
    data: dict[str, pa.Array | pa.ChunkedArray] = {}
    for name, col in (("_type", type_col), ("_pk", pk_col)):
        data[name] = rows.column(col).cast(pa.string()) if rows is not None and n else pa.array([], pa.string())
    for col in COMPARE_COLUMNS:
        typ = _TYPES.get(col, pa.string())
        if rows is not None and n and col in rows.column_names:
            data[col + suffix] = rows.column(col).cast(typ)
        else:
            data[col + suffix] = pa.nulls(n, typ)
    return pa.table(data)


def entity_changes(kind: str, a: pa.Table | None, b: pa.Table | None, type_col: str, pk_col: str) -> list[EntityChange]:
    """Changes from A to B among the rows read from each side (one live row or tombstone per key)."""
    left, right = _side(a, type_col, pk_col, "_a"), _side(b, type_col, pk_col, "_b")
    left = left.append_column("_in_a", pa.array([True] * left.num_rows, pa.bool_()))
    right = right.append_column("_in_b", pa.array([True] * right.num_rows, pa.bool_()))
    joined = left.join(right, ["_type", "_pk"], join_type="full outer")
    if joined.num_rows == 0:
        return []
    live_a, live_b = _live(joined, "a"), _live(joined, "b")
    differs = pa.array([False] * joined.num_rows)
    for col in ("version", "properties", "from_pk", "to_pk"):
        ca, cb = joined.column(col + "_a"), joined.column(col + "_b")
        same = pc.fill_null(pc.equal(ca, cb), False)
        both_null = pc.and_(pc.is_null(ca), pc.is_null(cb))
        differs = pc.or_(differs, pc.invert(pc.or_(same, both_null)))
    interesting = pc.or_(pc.xor(live_a, live_b), pc.and_(pc.and_(live_a, live_b), differs))
    picked = joined.filter(interesting)
    la = live_a.filter(interesting).to_pylist()
    lb = live_b.filter(interesting).to_pylist()
    out: list[EntityChange] = []
    cols = {c: picked.column(c).to_pylist() for c in picked.column_names}
    for i in range(picked.num_rows):
        before = _props(cols["properties_a"][i]) if la[i] else None
        after = _props(cols["properties_b"][i]) if lb[i] else None
        change = MODIFIED if la[i] and lb[i] else REMOVED if la[i] else ADDED
        props = property_changes(before, after)
        if kind == "link" and change == MODIFIED:
            for end in ("from_pk", "to_pk"):
                if cols[end + "_a"][i] != cols[end + "_b"][i]:
                    props += (PropertyChange(end, cols[end + "_a"][i], cols[end + "_b"][i]),)
        out.append(
            EntityChange(
                kind,
                cols["_type"][i],
                cols["_pk"][i],
                change,
                before,
                after,
                props,
                cols["version_a"][i] if la[i] else None,
                cols["version_b"][i] if lb[i] else None,
            )
        )
    out.sort(key=lambda c: (c.entity_type, c.pk))
    return out


def _live(joined: pa.Table, side: str) -> pa.Array:
    """Rows read on ``side`` that are not tombstones."""
    present = pc.fill_null(joined.column(f"_in_{side}"), False)
    return pc.and_(present, pc.invert(pc.fill_null(joined.column(f"deleted_{side}"), True)))


def _props(text: str | None) -> dict[str, Any] | None:
    return orjson.loads(text) if text else {}


def counts_by_type(changes: list[EntityChange]) -> dict[str, dict[str, int]]:
    """``{type: {added: n, removed: n, modified: n}}``."""
    out: dict[str, dict[str, int]] = {}
    for c in changes:
        per = out.setdefault(c.entity_type, {ADDED: 0, REMOVED: 0, MODIFIED: 0})
        per[c.change] += 1
    return out


# --- schema ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemaChange:
    change: str  # added | removed | renamed | widened
    column: str
    detail: str = ""


def schema_diff(a: Schema | None, b: Schema | None) -> list[SchemaChange]:
    """Columns added, removed, renamed (same field id, new name) and widened (type promoted), A → B."""
    fa = {f.field_id: f for f in (a.fields if a else ())}
    fb = {f.field_id: f for f in (b.fields if b else ())}
    out: list[SchemaChange] = []
    for fid in sorted(set(fa) | set(fb)):
        x, y = fa.get(fid), fb.get(fid)
        if x is None and y is not None:
            out.append(SchemaChange(ADDED, y.name, str(y.field_type)))
        elif y is None and x is not None:
            out.append(SchemaChange(REMOVED, x.name, str(x.field_type)))
        elif x is not None and y is not None:
            if x.name != y.name:
                out.append(SchemaChange("renamed", y.name, f"was {x.name}"))
            if x.field_type != y.field_type:
                out.append(SchemaChange("widened", y.name, f"{x.field_type} -> {y.field_type}"))
    return out
