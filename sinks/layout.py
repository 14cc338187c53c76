"""Table layouts: partition specs and sort orders of the three tables, and how they evolve (pure).

A layout is written as text so that an operator can type it (``causeway tables evolve``) and a
reader can see it (``causeway tables show``)::

    day(occurred_at)                                  # entity_events
    identity(object_type_id), bucket(4, object_pk)    # entity_common
    none                                              # unpartitioned

Terms: ``COL`` or ``identity(COL)``, ``bucket(N, COL)``, ``truncate(W, COL)``, ``year(COL)``,
``month(COL)``, ``day(COL)``, ``hour(COL)``; ``none`` is the unpartitioned spec, ``default`` the
table's standard layout (:data:`DEFAULT_LAYOUTS`). A sort order is a comma-separated column list
(ascending, nulls last), ``none`` for unsorted.

Evolution follows Iceberg's partition evolution: fields the target lacks are removed, fields it
adds are added, and files written before keep the spec they were written with (metadata only,
nothing is rewritten). :func:`plan_evolution` computes that difference; ``sinks.layout_run``
carries it out in one Nessie commit. Why each table has the layout it has: docs/architecture.md,
"Table layout".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import StringType

from streams.settings import Settings

#: Buckets of a projection's key in the standard layout (see docs/architecture.md, "Table layout"):
#: the setting's default, read from it so that the two cannot drift apart when the default changes
#: (a configured count reaches new tables through ``TableDef.spec_with``, not through this).
PROJECTION_BUCKETS: int = Settings.projection_buckets
#: First partition field id Iceberg assigns (field ids of a spec start here).
PARTITION_FIELD_ID_START = 1000

_NO_PARAM = {"identity", "year", "month", "day", "hour"}
_WITH_PARAM = {"bucket", "truncate"}
_TERM = re.compile(r"^\s*(?:(?P<fn>[a-z]+)\s*\((?P<args>[^()]*)\)|(?P<col>[A-Za-z_][A-Za-z0-9_]*))\s*$")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class LayoutError(ValueError):
    """A layout that cannot be parsed or does not fit the table (one line, for the CLI)."""


@dataclass(frozen=True, order=True)
class PartField:
    """One partition field: a transform of a source column (``param`` is N or W where it applies)."""

    transform: str
    column: str
    param: int | None = None

    def __str__(self) -> str:
        if self.param is not None:
            return f"{self.transform}({self.param}, {self.column})"
        return f"{self.transform}({self.column})"

    @property
    def name(self) -> str:
        """The partition field's name: ``object_type_id``, ``object_pk_bucket_16``, ``occurred_at_day``."""
        if self.transform == "identity":
            return self.column
        if self.param is not None:
            return f"{self.column}_{self.transform}_{self.param}"
        return f"{self.column}_{self.transform}"

    def iceberg(self) -> Transform:  # type: ignore[type-arg]
        simple: dict[str, Transform] = {  # type: ignore[type-arg]
            "identity": IdentityTransform(),
            "year": YearTransform(),
            "month": MonthTransform(),
            "day": DayTransform(),
            "hour": HourTransform(),
        }
        if self.transform == "bucket":
            return BucketTransform(self.param or 1)
        if self.transform == "truncate":
            return TruncateTransform(self.param or 1)
        return simple[self.transform]


Spec = tuple[PartField, ...]


@dataclass(frozen=True)
class Layout:
    """A table's partition fields and sort columns."""

    spec: Spec
    sort: tuple[str, ...]

    def describe(self) -> str:
        return f"spec {format_spec(self.spec)}; sorted by {format_sort(self.sort)}"


def default_layouts(buckets: int = PROJECTION_BUCKETS) -> dict[str, Layout]:
    """The standard layout of each table, with ``buckets`` buckets of a projection's key.

    ``buckets`` = 0 leaves the key unbucketed (projections partitioned by type only). The count is
    ``Settings.projection_buckets``: a flush of random keys writes a data file and a delete file per
    (type, bucket) it touches, so more buckets mean smaller files and more compaction (measured
    in docs/architecture.md, "Table layout").
    """

    def projection(type_col: str, pk_col: str) -> Layout:
        bucket = (PartField("bucket", pk_col, buckets),) if buckets > 0 else ()
        return Layout((PartField("identity", type_col), *bucket), (type_col, pk_col))

    return {
        "entity_events": Layout((PartField("day", "occurred_at"),), ("entity_type", "entity_pk", "version")),
        "entity_common": projection("object_type_id", "object_pk"),
        "entity_edge": projection("link_type", "link_pk"),
    }


DEFAULT_LAYOUTS: dict[str, Layout] = default_layouts()


# --- text -------------------------------------------------------------------------------------------


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise LayoutError(f"unbalanced parentheses in {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise LayoutError(f"unbalanced parentheses in {text!r}")
    parts.append("".join(cur))
    return parts


def default_layout(table: str | None, buckets: int = PROJECTION_BUCKETS) -> Layout:
    layouts = default_layouts(buckets)
    if table not in layouts:
        raise LayoutError(f"no default layout for table {table!r}")
    return layouts[table]


def parse_spec(text: str, table: str | None = None, buckets: int = PROJECTION_BUCKETS) -> Spec:
    """``"identity(a), bucket(16, b)"`` → fields; ``none`` → (); ``default`` → the table's standard
    (with ``buckets`` buckets of a projection's key, ``Settings.projection_buckets``)."""
    stripped = text.strip()
    if stripped.lower() == "default":
        return default_layout(table, buckets).spec
    if stripped.lower() in ("none", "unpartitioned", ""):
        return ()
    fields: list[PartField] = []
    for term in _split_top(stripped):
        m = _TERM.match(term)
        if m is None:
            raise LayoutError(f"not a partition term: {term.strip()!r} (try bucket(16, col), day(col), col)")
        if m.group("col"):
            fields.append(PartField("identity", m.group("col")))
            continue
        fn, args = m.group("fn"), [a.strip() for a in m.group("args").split(",")]
        if fn in _NO_PARAM:
            if len(args) != 1 or not _COLUMN.match(args[0]):
                raise LayoutError(f"{fn}() takes one column: {term.strip()!r}")
            fields.append(PartField(fn, args[0]))
        elif fn in _WITH_PARAM:
            if len(args) != 2 or not args[0].isdigit() or not _COLUMN.match(args[1]):
                raise LayoutError(f"{fn}() takes a positive number and a column: {term.strip()!r}")
            n = int(args[0])
            if n < 1:
                raise LayoutError(f"{fn}() needs a positive number: {term.strip()!r}")
            fields.append(PartField(fn, args[1], n))
        else:
            raise LayoutError(f"unknown transform {fn!r} (identity, bucket, truncate, year, month, day, hour)")
    if len({f.name for f in fields}) != len(fields):
        raise LayoutError(f"a partition field is repeated in {text!r}")
    return tuple(fields)


def parse_sort(text: str, table: str | None = None) -> tuple[str, ...]:
    """``"a, b"`` → ``("a", "b")``; ``none`` → (); ``default`` → the table's standard sort."""
    stripped = text.strip()
    if stripped.lower() == "default":
        return default_layout(table).sort
    if stripped.lower() in ("none", "unsorted", ""):
        return ()
    cols = tuple(c.strip() for c in stripped.split(","))
    bad = [c for c in cols if not _COLUMN.match(c)]
    if bad:
        raise LayoutError(f"not a column name in sort order: {bad[0]!r}")
    return cols


def format_spec(spec: Spec) -> str:
    return ", ".join(str(f) for f in spec) if spec else "none"


def format_sort(sort: Iterable[str]) -> str:
    cols = list(sort)
    return ", ".join(cols) if cols else "none"


# --- Iceberg objects --------------------------------------------------------------------------------


def check(spec: Spec, sort: Iterable[str], schema: Schema) -> None:
    """Raise LayoutError when a field's column is missing or its transform cannot take its type."""
    for f in spec:
        field = _find(schema, f.column)
        if not f.iceberg().can_transform(field.field_type):
            raise LayoutError(f"{f.transform} cannot partition {f.column} ({field.field_type})")
    for col in sort:
        _find(schema, col)


def _find(schema: Schema, column: str):  # type: ignore[no-untyped-def]
    try:
        return schema.find_field(column)
    except ValueError:
        raise LayoutError(f"no column {column!r} in the table") from None


def partition_spec(spec: Spec, schema: Schema) -> PartitionSpec:
    """The Iceberg spec of ``spec`` on ``schema`` (field ids from 1000, for a new table)."""
    check(spec, (), schema)
    fields = [
        PartitionField(_find(schema, f.column).field_id, PARTITION_FIELD_ID_START + i, f.iceberg(), f.name)
        for i, f in enumerate(spec)
    ]
    return PartitionSpec(*fields)


def sort_order(sort: Iterable[str], schema: Schema) -> SortOrder:
    """The Iceberg sort order of ``sort`` (ascending, nulls last) on ``schema``; order id 1."""
    fields = [
        SortField(
            source_id=_find(schema, c).field_id,
            transform=IdentityTransform(),
            direction=SortDirection.ASC,
            null_order=NullOrder.NULLS_LAST,
        )
        for c in sort
    ]
    return SortOrder(*fields) if fields else SortOrder(order_id=0)


def part_field(f: PartitionField, schema: Schema) -> PartField | None:
    """The layout form of one Iceberg partition field; None for a void field (a removed one in v1)."""
    t = f.transform
    if isinstance(t, VoidTransform):
        return None
    column = schema.find_column_name(f.source_id) or f"#{f.source_id}"
    if isinstance(t, BucketTransform):
        return PartField("bucket", column, t.num_buckets)
    if isinstance(t, TruncateTransform):
        return PartField("truncate", column, t.width)
    return PartField(str(t), column)


def from_iceberg(spec: PartitionSpec, schema: Schema) -> Spec:
    """The layout form of an Iceberg spec."""
    return tuple(pf for f in spec.fields if (pf := part_field(f, schema)) is not None)


def sort_columns(order: SortOrder, schema: Schema) -> tuple[str, ...]:
    return tuple(schema.find_column_name(f.source_id) or f"#{f.source_id}" for f in order.fields)


# --- evolution --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evolution:
    """What moving a table from one layout to another changes (metadata only)."""

    old: Layout
    new: Layout
    remove: Spec
    add: Spec

    @property
    def spec_changed(self) -> bool:
        return bool(self.remove or self.add)

    @property
    def sort_changed(self) -> bool:
        return self.old.sort != self.new.sort

    @property
    def changed(self) -> bool:
        return self.spec_changed or self.sort_changed


def plan_evolution(old: Layout, new: Layout) -> Evolution:
    """The fields to remove and add to go from ``old`` to ``new`` (kept fields keep their ids)."""
    remove = tuple(f for f in old.spec if f not in new.spec)
    add = tuple(f for f in new.spec if f not in old.spec)
    return Evolution(old, new, remove, add)


# --- pruning ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyScan:
    """Which files may hold the rows of some ``(type, pk)`` keys (plus every row of some types: a truncate).

    Pruning is by partition only: under a spec with identity on the type column and a bucket of
    the pk column a file is kept when its (type, bucket) is one a key falls in, or its type is
    truncated; a spec with only one of the two prunes by that one (a bucket-only spec keeps every
    bucket while a type is truncated: its rows may be in any); files of specs with neither are
    always kept. Never by column statistics: a flush merges and drops delete files,
    and a delete file may name any data file of its partition, so every data file of a kept
    partition must be in the flush's state (a delete file merged without the positions of a
    data file pruned by min/max would bring that file's deleted rows back). Pruning whole
    partitions through pyiceberg is not an option either: it plans a large ``In`` very slowly
    (20k keys against 32 files: 115 s of planning).
    """

    type_col: str
    pk_col: str
    keys: frozenset[tuple[str, str]]
    types: frozenset[str] = frozenset()

    def keeps(self, partition: Any, spec: PartitionSpec, schema: Schema) -> bool:
        """Whether a data file with ``partition`` (under ``spec``) may hold a selected row."""
        typ, buckets, bucket = self._fields(partition, spec, schema)
        if typ is not None and typ[0] in self.types:
            return True  # a truncated type: every row of it
        if buckets is None:
            return typ is None or typ[0] in self._key_types()
        if typ is None:
            return bool(self.types) or bucket in {b for _, b in self._pairs(buckets)}
        return (typ[0], bucket) in self._pairs(buckets)

    def pks(self) -> tuple[str, ...]:
        """The keys' distinct pks, sorted (what :meth:`pk_positions_in` indexes)."""
        cache: dict[str, tuple[str, ...]] = self.__dict__.setdefault("_pk_list", {})
        if "pks" not in cache:
            cache["pks"] = tuple(sorted({pk for _, pk in self.keys}))
        return cache["pks"]

    def pk_positions_in(self, partition: Any, spec: PartitionSpec, schema: Schema) -> tuple[int, ...]:
        """Positions in :meth:`pks` of the pks of the keys that may lie in a data file with
        ``partition`` (under ``spec``): what a flush probes that file's key filter with
        (``sinks.keyfilter``). Truncated types are not keys: a caller with ``types`` reads their
        files whole."""
        typ, buckets, bucket = self._fields(partition, spec, schema)
        cache: dict[tuple[Any, ...], tuple[int, ...]] = self.__dict__.setdefault("_positions_cache", {})
        where = (typ, buckets, bucket)
        if where not in cache:
            groups = self._groups(buckets or 1)
            hits = [
                at
                for (t, b), positions in groups.items()
                if (typ is None or t == typ[0]) and (buckets is None or b == bucket)
                for at in positions
            ]
            cache[where] = tuple(sorted(set(hits)))
        return cache[where]

    def _fields(self, partition: Any, spec: PartitionSpec, schema: Schema) -> tuple[tuple[Any] | None, int | None, Any]:
        """(boxed type value or None, bucket count or None, bucket) of ``partition`` under ``spec``."""
        typ: tuple[Any] | None = None  # boxed: a partition value may be None
        buckets: int | None = None
        bucket: Any = None
        for i, f in enumerate(spec.fields):
            column = schema.find_column_name(f.source_id)
            if column == self.type_col and isinstance(f.transform, IdentityTransform):
                typ = (partition[i],)
            elif column == self.pk_col and isinstance(f.transform, BucketTransform):
                buckets, bucket = f.transform.num_buckets, partition[i]
        return typ, buckets, bucket

    def _key_types(self) -> frozenset[str]:
        cache: dict[str, frozenset[str]] = self.__dict__.setdefault("_type_cache", {})
        if "types" not in cache:
            cache["types"] = frozenset(t for t, _ in self.keys)
        return cache["types"]

    def _pairs(self, n: int) -> frozenset[tuple[str, int]]:
        """The (type, bucket) pairs of the keys under ``bucket(n, pk)``."""
        cache: dict[int, frozenset[tuple[str, int]]] = self.__dict__.setdefault("_bucket_cache", {})
        if n not in cache:
            cache[n] = frozenset(self._groups(n))
        return cache[n]

    def _groups(self, n: int) -> dict[tuple[str, int], list[int]]:
        """The keys' pks (positions in :meth:`pks`) by (type, bucket under ``bucket(n, pk)``)."""
        cache: dict[int, dict[tuple[str, int], list[int]]] = self.__dict__.setdefault("_groups_cache", {})
        if n not in cache:
            import pyarrow as pa

            pks = self.pks()
            buckets = BucketTransform(n).pyarrow_transform(StringType())(pa.array(pks, pa.string())).to_pylist()
            at = {pk: (i, b) for i, (pk, b) in enumerate(zip(pks, buckets, strict=True))}
            groups: dict[tuple[str, int], list[int]] = {}
            for t, pk in self.keys:
                i, b = at[pk]
                groups.setdefault((t, b), []).append(i)
            cache[n] = groups
        return cache[n]


def key_filter(type_col: str, pk_col: str, keys: Iterable[tuple[str, str]], types: Iterable[str] = ()) -> KeyScan:
    """The files that may hold the rows of ``(type, pk)`` ``keys`` and every row of ``types`` (:class:`KeyScan`).

    With a type and bucket spec a flush's scan covers only the (type, bucket) partitions its keys fall in.
    """
    return KeyScan(type_col, pk_col, frozenset(keys), frozenset(types))


# --- small flushes -----------------------------------------------------------------------------------


def writes_one_file(spec: PartitionSpec, partitions: int, row_bytes: int, small_file_bytes: int) -> bool:
    """Whether a projection flush writes its new rows as one file under the unpartitioned spec. Pure.

    A flush of ``partitions`` partitions under ``spec`` writes one file per partition, and every
    small one is later superseded by the small-file merge with its ~3.3 KB Parquet footer: a
    type-only table of 3 types paid 3 footers per small flush where the unpartitioned table paid
    one (issue 21: 1.05-1.11x its rewrites at 1M keys, all of it those footers, and no merge
    policy takes it back). So a flush whose rows (``row_bytes`` in memory, more than on disk)
    make a small file writes that one file; the merge rewrites it into the partitions
    (``Compaction.pick`` groups it with its own spec). Never under a spec with a bucket:
    bucketing is chosen for flushes and key indexes that touch only their buckets, and a file of
    every bucket would be read by every flush (tests/integration/test_layout.py).
    """
    bucketed = any(isinstance(f.transform, BucketTransform) for f in spec.fields)
    return partitions > 1 and row_bytes < small_file_bytes and not bucketed


def unpartitioned_spec(specs: Mapping[int, PartitionSpec]) -> PartitionSpec:
    """The table's unpartitioned spec, or the one to add (the next spec id) when it has none. Pure.

    A table created unpartitioned and evolved since still lists it: reused, never added twice.
    """
    for spec in specs.values():
        if spec.is_unpartitioned():
            return spec
    return PartitionSpec(spec_id=max(specs, default=-1) + 1)
