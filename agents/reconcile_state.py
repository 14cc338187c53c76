"""Reconciliation's checkpoint of one world, in Arrow: the event log's fold and the projection's live
rows, kept between passes and advanced by the files the branch gained or lost since the last one.

A pass used to replay the whole log into Python objects at every run: ~50 CPU-seconds and 3.8 GB
for a world of 670k objects (docs/benchmarks.md, soak). Iceberg files never change once written —
a commit adds files and removes files — so a checkpoint keyed by file can be advanced by reading
only the files that are new since the last pass:

* **log** (``wanted``): per key, the applied event that must have written its projection row, in
  commit order ``(committed_at, batch_seq, position)``, with a digest of its properties. Folding is
  idempotent: a file that compaction rewrote holds rows already folded (an event id that already
  wins its key is skipped, older ones lose again), so a compacted log costs a read, no digests.
  A TRUNCATE drops every key of its type with an older event. A log that lost rows (a rollback:
  the files that left it held more rows than the ones that came) is folded again from scratch.
* **projection** (``files``): per live data file, its rows' key, writer and properties digest, and
  the positions its delete files mask. A file's properties are digested once, when it appears.

The comparison is then vectorized over both (a hash join in Arrow); only the keys that differ,
normally none, reach Python. Per pass: reads and digests proportional to what changed, plus one
Arrow join over the world's keys (measured in docs/benchmarks.md). Memory: the checkpoint's
columns (a few hundred bytes per key) plus one chunk of the log being folded
(:data:`FOLD_CHUNK_ROWS`), instead of every log row as Python dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from agents.reconcile_plan import digest
from models.events import ChangeType, EntityKind

#: Separator of a key's type and pk in the ``key`` column (not a character either may hold).
SEP = "\x1f"
#: Log rows folded at once: a full fold of a large log is memory-bounded by this many rows.
FOLD_CHUNK_ROWS = 250_000

LOG_COLUMNS = (
    "kind",
    "applied",
    "entity_type",
    "entity_pk",
    "change_type",
    "version",
    "event_id",
    "committed_at",
    "batch_seq",
    "after_properties",
)
PROJECTION_COLUMNS = ("object_type_id", "object_pk", "version", "deleted", "event_id", "properties")

_WRITER = [
    ("key", pa.string()),
    ("type", pa.string()),
    ("version", pa.int64()),
    ("deleted", pa.bool_()),
    ("event_id", pa.string()),
    ("digest", pa.string()),
]
#: The log's fold: per key, the row that must be in the projection, and its commit order.
WANTED = pa.schema([*_WRITER, ("committed_at", pa.int64()), ("batch_seq", pa.int64()), ("seq", pa.int64())])
#: A projection data file's rows: who wrote each, and its position in the file.
ROWS = pa.schema([*_WRITER, ("_pos", pa.int64())])
_ORDER = ("committed_at", "batch_seq", "seq")
_COMPARED = ("version", "deleted", "event_id", "digest")

Order = tuple[int, int, int]
ReadColumns = Callable[[str, tuple[str, ...]], pa.Table]
ReadDeletes = Callable[[str], Mapping[str, pa.Array]]


@dataclass(frozen=True)
class FileInfo:
    """A live data file: path, rows, and the delete files that apply (``sinks.readback.FileRef``)."""

    path: str
    rows: int
    deletes: frozenset[str]


def _str(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A text column as ``string`` (files written by pyiceberg hold ``large_string``)."""
    return column.cast(pa.string())


def keys(types: pa.Array | pa.ChunkedArray, pks: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    return pc.binary_join_element_wise(_str(types), _str(pks), SEP)


def split_key(key: str) -> tuple[str, str]:
    t, _, pk = key.partition(SEP)
    return t, pk


def digests(texts: pa.Array | pa.ChunkedArray, deleted: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Properties digests as :func:`agents.reconcile_plan.digest` makes them; None for a deleted row."""
    return pa.array(
        [None if d else digest(t) for t, d in zip(texts.to_pylist(), deleted.to_pylist(), strict=True)], pa.string()
    )


def last_per_key(t: pa.Table) -> pa.Table:
    """The last row of each key in commit order (``committed_at``, ``batch_seq``, ``seq``)."""
    if t.num_rows == 0:
        return t
    s = t.take(pc.sort_indices(t, [("key", "ascending"), *((c, "ascending") for c in _ORDER)]))
    k = s.column("key")
    n = s.num_rows
    last = pc.not_equal(k.slice(0, n - 1), k.slice(1))  # chunked: a key differs from the next one
    return s.filter(pa.chunked_array([*last.chunks, pa.array([True])], pa.bool_()))


def log_candidates(raw: pa.Table, seq0: int) -> pa.Table:
    """A log file's applied object rows as fold candidates; ``seq`` is ``seq0`` + the row's position."""
    n = raw.num_rows
    mask = pc.and_(pc.equal(raw.column("kind"), EntityKind.OBJECT.value), pc.fill_null(raw.column("applied"), False))
    pos = pa.array(range(seq0, seq0 + n), pa.int64())
    batch_seq = (
        pc.fill_null(raw.column("batch_seq").cast(pa.int64()), 0)
        if "batch_seq" in raw.column_names
        else pa.repeat(pa.scalar(0, pa.int64()), n)
    )
    t = pa.table({
        "key": keys(raw.column("entity_type"), raw.column("entity_pk")),
        "type": _str(raw.column("entity_type")),
        "version": raw.column("version").cast(pa.int64()),
        "deleted": pc.equal(raw.column("change_type"), ChangeType.DELETE.value),
        "event_id": _str(raw.column("event_id")),
        "digest": pa.nulls(n, pa.string()),  # filled for the rows that win their key
        "change_type": _str(raw.column("change_type")),
        "after_properties": _str(raw.column("after_properties")),
        "committed_at": raw.column("committed_at").cast(pa.int64()),
        "batch_seq": batch_seq,
        "seq": pos,
    })  # fmt: skip
    return t.filter(mask)


def _before(t: pa.Table, order: Order) -> pa.Array | pa.ChunkedArray:
    """Rows of ``t`` whose commit order is older than ``order``."""
    c, b, s = (t.column(name) for name in _ORDER)
    older = pc.less(s, order[2])
    older = pc.or_(pc.less(b, order[1]), pc.and_(pc.equal(b, order[1]), older))
    return pc.or_(pc.less(c, order[0]), pc.and_(pc.equal(c, order[0]), older))


#: Chunks the log fold keeps before it merges them into one (each fold appends one).
MAX_CHUNKS = 32


def _drop(t: pa.Table, mask: pa.ChunkedArray) -> pa.Table:
    """``t`` without the rows ``mask`` selects, copying only the chunks that lose rows (a fold
    touches a few of the world's chunks; filtering the whole table would copy all of it)."""
    batches, offset = [], 0
    for batch in t.to_batches():
        m = mask.slice(offset, batch.num_rows)
        offset += batch.num_rows
        batches.append(batch.filter(pc.invert(m)) if pc.any(m).as_py() else batch)
    return pa.Table.from_batches(batches, t.schema)


def _append(t: pa.Table, rows: pa.Table) -> pa.Table:
    out = pa.concat_tables([t, rows])
    return out.combine_chunks() if out.column(0).num_chunks > MAX_CHUNKS else out


@dataclass
class ProjectionFile:
    rows: pa.Table  # ROWS: every row of the file
    deletes: frozenset[str] = frozenset()
    live: pa.Table | None = None  # rows minus the positions ``deletes`` mask


@dataclass
class Checkpoint:
    """One world's log fold and projection rows, as of the files last read (see the module doc)."""

    table_ids: tuple[str, str] = ("", "")  # the two tables' uuids: a recreated table starts over
    log_files: dict[str, int] = field(default_factory=dict)  # folded log file -> rows
    wanted: pa.Table = field(default_factory=WANTED.empty_table)
    truncated: dict[str, Order] = field(default_factory=dict)  # type -> order of its latest TRUNCATE
    next_seq: int = 0
    files: dict[str, ProjectionFile] = field(default_factory=dict)
    delete_splits: dict[str, Mapping[str, pa.Array]] = field(default_factory=dict)
    #: Keys to compare at the next pass (None: all): what changed since the last one, and what differed then.
    dirty: set[str] | None = None
    #: What the last advance read and digested (rows), for the pass's log line and the tests.
    read_rows: int = 0
    digested: int = 0

    # --- the log -----------------------------------------------------------------------------

    def advance_log(self, current: Iterable[FileInfo], read: ReadColumns) -> None:
        now = {f.path: f for f in current}
        gone = sum(n for p, n in self.log_files.items() if p not in now)
        came = [f for p, f in now.items() if p not in self.log_files]
        if gone > sum(f.rows for f in came):  # rows left the log: not a compaction; fold it again
            self.log_files, self.wanted, self.truncated, self.next_seq = {}, WANTED.empty_table(), {}, 0
            self.dirty = None
            came = list(now.values())
        self.log_files = {p: n for p, n in self.log_files.items() if p in now}
        chunk: list[pa.Table] = []
        rows = 0
        for f in came:
            raw = read(f.path, LOG_COLUMNS)
            self.read_rows += raw.num_rows
            chunk.append(log_candidates(raw, self.next_seq))
            self.next_seq += max(raw.num_rows, 1)
            rows += raw.num_rows
            self.log_files[f.path] = f.rows
            if rows >= FOLD_CHUNK_ROWS:
                self._fold(pa.concat_tables(chunk))
                chunk, rows = [], 0
        if chunk:
            self._fold(pa.concat_tables(chunk))

    def _fold(self, new: pa.Table) -> None:
        is_trunc = pc.equal(new.column("change_type"), ChangeType.TRUNCATE.value)
        for r in new.filter(is_trunc).select(["type", *_ORDER]).to_pylist():
            order = (r["committed_at"], r["batch_seq"], r["seq"])
            if order > self.truncated.get(r["type"], (-1, -1, -1)):
                self.truncated[r["type"]] = order
                self.dirty = None  # every key of the type may have gone: compare them all
        cand = self._after_truncates(new.filter(pc.invert(is_trunc)))
        # An event that already wins its key (a compacted copy) changes nothing: skip it unread.
        # (The world's column probes a hash set of the candidates, not the other way round.)
        ids = self.wanted.column("event_id")
        known = ids.filter(pc.is_in(ids, value_set=cand.column("event_id")))
        if len(known):
            cand = cand.filter(pc.invert(pc.is_in(cand.column("event_id"), value_set=known.combine_chunks())))
        cand = last_per_key(cand)
        self._mark(cand.column("key"))
        if cand.num_rows:
            touched = pc.is_in(self.wanted.column("key"), value_set=cand.column("key"))
            old = self.wanted.filter(touched)
            old = old.append_column("fresh", pa.repeat(pa.scalar(False), old.num_rows))
            fresh = cand.append_column("fresh", pa.repeat(pa.scalar(True), cand.num_rows))
            props = fresh.column("after_properties")
            both = pa.concat_tables([
                old.append_column("after_properties", pa.nulls(old.num_rows, props.type)),
                fresh.select([*WANTED.names, "fresh", "after_properties"]),
            ])  # fmt: skip
            won = last_per_key(both)
            new_won = won.filter(won.column("fresh"))
            self.digested += new_won.num_rows
            new_won = new_won.set_column(
                new_won.schema.get_field_index("digest"),
                "digest",
                digests(new_won.column("after_properties"), new_won.column("deleted")),
            ).select(WANTED.names)
            lost = pc.is_in(self.wanted.column("key"), value_set=new_won.column("key"))
            self.wanted = _append(_drop(self.wanted, lost), new_won)
        self.wanted = self._after_truncates(self.wanted)

    def _after_truncates(self, t: pa.Table) -> pa.Table:
        """``t`` without the rows a later TRUNCATE of their type dropped."""
        for typ, order in self.truncated.items():
            drop = pc.and_(pc.equal(t.column("type"), typ), _before(t, order))
            if pc.any(drop).as_py():
                t = t.filter(pc.invert(drop))
        return t

    # --- the projection ----------------------------------------------------------------------

    def advance_projection(self, current: Iterable[FileInfo], read: ReadColumns, deletes_of: ReadDeletes) -> None:
        now = {f.path: f for f in current}
        for p, pf in self.files.items():
            if p not in now and pf.live is not None:
                self._mark(pf.live.column("key"))
        self.files = {p: pf for p, pf in self.files.items() if p in now}
        for path in now:
            if path not in self.files:
                raw = read(path, PROJECTION_COLUMNS)
                self.read_rows += raw.num_rows
                self.digested += raw.num_rows
                deleted = raw.column("deleted")
                rows = pa.table({
                    "key": keys(raw.column("object_type_id"), raw.column("object_pk")),
                    "type": _str(raw.column("object_type_id")),
                    "version": raw.column("version").cast(pa.int64()),
                    "deleted": deleted,
                    "event_id": _str(raw.column("event_id")),
                    "digest": digests(raw.column("properties"), deleted),
                    "_pos": pa.array(range(raw.num_rows), pa.int64()),
                })  # fmt: skip
                self.files[path] = ProjectionFile(rows.combine_chunks())
                self._mark(rows.column("key"))
        live_deletes = {d for f in now.values() for d in f.deletes}
        self.delete_splits = {d: s for d, s in self.delete_splits.items() if d in live_deletes}
        for path, f in now.items():
            pf = self.files[path]
            if pf.live is not None and pf.deletes == f.deletes:
                continue
            masked = []
            for d in f.deletes:
                if d not in self.delete_splits:
                    self.delete_splits[d] = deletes_of(d)
                pos = self.delete_splits[d].get(path)
                if pos is not None:
                    masked.append(pos.cast(pa.int64()))
            pf.deletes = f.deletes
            before = pf.live
            pf.live = (
                pf.rows.filter(pc.invert(pc.is_in(pf.rows.column("_pos"), value_set=pa.concat_arrays(masked))))
                if masked
                else pf.rows
            )
            if before is not None:  # rows masked or unmasked since: their keys changed
                was, now_live = before.column("_pos"), pf.live.column("_pos")
                self._mark(before.filter(pc.invert(pc.is_in(was, value_set=now_live))).column("key"))
                self._mark(pf.live.filter(pc.invert(pc.is_in(now_live, value_set=was))).column("key"))

    def _mark(self, keys: pa.Array | pa.ChunkedArray) -> None:
        if self.dirty is not None and len(keys):
            self.dirty.update(keys.to_pylist())

    def differing(self, projection: pa.Table) -> set[str]:
        """Keys whose projection row differs from the log's: among the keys a file read or dropped
        since the last comparison and those that differed then (every key the first time)."""
        odd = mismatched_keys(projection, self.wanted, self.dirty)
        self.dirty = set(odd)
        return odd

    def projection(self) -> tuple[pa.Table, list[str]]:
        """The live projection rows (ROWS + ``_fid``) and the file path of each ``_fid``."""
        paths = list(self.files)
        parts = []
        for fid, path in enumerate(paths):
            live = self.files[path].live
            if live is not None and live.num_rows:
                parts.append(live.append_column("_fid", pa.repeat(pa.scalar(fid, pa.int32()), live.num_rows)))
        if not parts:
            return ROWS.empty_table().append_column("_fid", pa.array([], pa.int32())), paths
        return pa.concat_tables(parts), paths

    def nbytes(self) -> int:
        return int(self.wanted.nbytes) + sum(int(pf.rows.nbytes) for pf in self.files.values())


# --- the comparison (pure, vectorized) -------------------------------------------------------------


def live_counts(t: pa.Table) -> dict[str, int]:
    """Rows that are not tombstones, per type."""
    alive = t.filter(pc.invert(t.column("deleted"))).column("type")
    vc = pc.value_counts(alive)
    return dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True))


def mismatched_keys(projection: pa.Table, wanted: pa.Table, only: Iterable[str] | None = None) -> set[str]:
    """Keys whose projection row is missing, extra, duplicated, or differs from the log's
    (writer or properties digest): the only keys a pass looks at one by one."""
    if only is not None:
        subset = pa.array(list(only), pa.string())
        projection = projection.filter(pc.is_in(projection.column("key"), value_set=subset))
        wanted = wanted.filter(pc.is_in(wanted.column("key"), value_set=subset))
    out: set[str] = set()
    vc = pc.value_counts(projection.column("key"))
    dup = pc.greater(vc.field("counts"), 1)
    out.update(vc.field("values").filter(dup).to_pylist())
    cols = ["key", *_COMPARED]
    j = projection.select(cols).join(
        wanted.select(cols), keys="key", join_type="full outer", left_suffix="_p", right_suffix="_w"
    )
    differ = pc.or_(pc.is_null(j.column("version_p")), pc.is_null(j.column("version_w")))
    for c in _COMPARED:
        a, b = j.column(f"{c}_p"), j.column(f"{c}_w")
        ne = pc.and_(pc.fill_null(pc.not_equal(a, b), True), pc.invert(pc.and_(pc.is_null(a), pc.is_null(b))))
        differ = pc.or_(differ, ne)
    out.update(j.filter(differ).column("key").to_pylist())
    return out
