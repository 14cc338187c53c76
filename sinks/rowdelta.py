"""Merge-on-read row changes for pyiceberg: positional delete files and a pk → (file, position) index.

pyiceberg 0.12 writes deletes only copy-on-write (a changed row rewrites its whole data file) but it
*reads* positional delete files. This module fills the gap for the projections:

* :func:`read_index` reads only the key columns (plus ``version`` / ``deleted``) of the live data
  files, with each row's ``(file, pos)``, minus the positions already deleted — the pk index of the
  snapshot being committed against. It is rebuilt from the table on every attempt, so it can never
  be stale; reading two or three columns is cheap next to rewriting files.
* :func:`write_position_deletes` writes one Iceberg position-delete file (``file_path``, ``pos``).
* :class:`RowDelta` is a snapshot producer (built on pyiceberg's ``_SnapshotProducer``) that adds
  data files and delete files and removes data / delete files in one snapshot, writing a DELETES
  manifest for the delete files. It consolidates manifests when there are too many, so the
  manifest list stays short.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.partitioning import PartitionKey, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetSnapshotRefUpdate,
    UpdatesAndRequirements,
)
from pyiceberg.table.update.snapshot import _new_manifest_file_name, _new_manifest_list_file_name, _SnapshotProducer
from pyiceberg.typedef import Record

from sinks import manifest_cache
from sinks.fileio import SizedOutputFile, open_output
from sinks.filter_spill import FilterSpill
from sinks.keyfilter import MIN_ROWS, KeyFilter, Probe
from sinks.layout import KeyScan
from sinks.manifest_write import ManifestListWriter, ManifestWriter, spec_facts

FILE_PATH_ID = 2147483546
POS_ID = 2147483545

DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": str(FILE_PATH_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_ID)}),
    ]
)


@dataclass
class LiveFile:
    """A live data file of the snapshot with its delete state."""

    data_file: DataFile
    deleted: pa.Array  # positions already deleted (int64, unique)

    @property
    def live_rows(self) -> int:
        return self.data_file.record_count - len(self.deleted)


@dataclass
class TableState:
    """What a flush needs to know about a projection table at one snapshot."""

    files: dict[str, LiveFile] = field(default_factory=dict)
    delete_files: dict[str, DataFile] = field(default_factory=dict)
    # delete file -> {data file it names -> positions}
    delete_positions: dict[str, dict[str, pa.Array]] = field(default_factory=dict)
    index: pa.Table | None = None  # key columns + version + deleted + _file + _pos, live rows only
    bytes_read: int = 0
    #: Data files whose columns the lookup read (from the cache or the file), and their rows; the
    #: files their key filter excluded are in ``files`` but were not read.
    files_read: int = 0
    rows_read: int = 0


Matcher = Callable[[pa.Table], "pa.Array | pa.ChunkedArray"]


class FileCache:
    """Parsed columns of immutable files, by path, bounded by bytes (LRU); thread-safe.

    Iceberg data and delete files never change once written (a change writes new files), so a
    cached read can never be stale: which files are live, and which positions are deleted, is
    still decided from the snapshot being committed against on every attempt.
    """

    #: What a cached entry costs beyond its buffers' ``nbytes``: the C++ objects of a small table
    #: (schema, arrays, buffer headers; 2.8-4.1 KB of glibc malloc for a 4-column key-index entry,
    #: measured) and the pool's rounding. A soak's index entries average ~5 KB of buffers, so
    #: counting buffers only let the cache keep about twice its bound.
    ENTRY_BYTES = 4096

    def __init__(
        self,
        max_bytes: int = 256 * 1024 * 1024,
        spill: FilterSpill | None = None,
        idle_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes = max_bytes
        #: Key columns and kept rows not used for this long go, whatever the bound (0: never). A
        #: table that keeps growing (fresh keys) seeds an entry for every file it writes, and most
        #: are never read again: held to the bound, they filled it over ~40 minutes of a soak, so the
        #: worker's memory followed the table's history, not the keys it still updates.
        self.idle_s = idle_s
        self._clock = clock
        #: When each key-column entry (by its ``_items`` key) and each kept-rows entry (by path) was
        #: last put or read: the dicts are in that order too (LRU), so the idle ones are at the front.
        self._used: dict[Any, float] = {}
        self._items: OrderedDict[tuple[str, tuple[str, ...]], pa.Table] = OrderedDict()
        #: Every column set ``_items`` was keyed with (a handful): ``forget`` finds a path's entries.
        self._column_sets: set[tuple[str, ...]] = set()
        self._bytes = 0
        self._lock = threading.Lock()
        #: Delete files split per data file they name (a delete file's few paths; small).
        self._split: OrderedDict[str, dict[str, pa.Array]] = OrderedDict()
        self.max_split_files = 4096
        #: Every column of small files a flush wrote, under the schema they were written with: the
        #: small-file merge reads them back a few flushes later (``Compaction.rewrites``). Bounded
        #: apart, at a quarter of ``max_bytes``, so full rows never evict the key index.
        self._rows: OrderedDict[str, pa.Table] = OrderedDict()
        self._rows_bytes = 0
        #: Key filters of data files (``sinks.keyfilter``, 5-10 bytes a key), by (path, key column):
        #: a lookup reads only the files whose filter may hold one of its keys, so every lookup
        #: probes the filters of every large file it may touch. They share ``max_bytes`` with the key
        #: columns, up to half of it (``filter_share``), and come first: a filter put evicts key
        #: columns past the bound, key columns never evict a filter. An evicted filter goes to
        #: ``spill`` (local disk) and is read back from there; without one, or once the spill
        #: dropped it, it is rebuilt when its file is next read (the file then read whole).
        self._filters: OrderedDict[tuple[str, str], KeyFilter] = OrderedDict()
        self._filters_bytes = 0
        self._filter_columns: set[str] = set()  # as ``_column_sets``, for ``forget``
        self.min_filter_rows = MIN_ROWS
        self.spill = spill

    def get(
        self, io: FileIO, path: str, columns: tuple[str, ...] | None, keep: bool = True, touch: bool = True
    ) -> tuple[pa.Table, bool]:
        """The file's ``columns`` (all when None) and whether it came from the cache; a read is
        kept only when ``keep`` (a file read again only for rare hits need not take cache space).
        A hit counts as a use (recency, ``idle_s``) only when ``touch``: a caller that reads a
        file on its key filter's "maybe" calls :meth:`touch` once the file held one of its keys."""
        key = (path, columns or ())
        with self._lock:
            now = self._expire_idle()
            hit = self._items.get(key)
            if hit is not None:
                if touch:
                    self._items.move_to_end(key)
                    self._used[key] = now
                return hit, True
        with io.new_input(path).open() as f:
            table = pq.read_table(f, columns=list(columns) if columns else None)
        with self._lock:
            if keep and table.nbytes <= self.max_bytes:
                self._column_sets.add(key[1])
                self._bytes = _lru_put(self._items, key, table, self._bytes, self._columns_bound(), self._used)
                self._used[key] = self._clock()
        return table, False

    def touch(self, paths: Iterable[str], columns: tuple[str, ...]) -> None:
        """Count a use of the ``columns`` of each of ``paths`` still held (see :meth:`get`)."""
        with self._lock:
            now = self._clock()
            for path in paths:
                key = (path, columns)
                if key in self._items:
                    self._items.move_to_end(key)
                    self._used[key] = now

    def seed(self, path: str, columns: tuple[str, ...], table: pa.Table) -> None:
        """Keep ``table`` as the ``columns`` of the file just written at ``path``: the next flush
        reads the previous flush's files, and the writer still holds their rows.

        A written file's rows are a slice of the whole flush's table, whose ``nbytes`` counts only
        the slice while it keeps every buffer of the flush alive: the slice is copied into buffers
        of its own, so the bound counts what the entry keeps (a unit test measured 6x the bound).
        """
        key = (path, columns)
        if table.nbytes > self.max_bytes:
            return
        table = _own_buffers(table)
        with self._lock:
            now = self._expire_idle()
            self._column_sets.add(columns)
            self._bytes = _lru_put(self._items, key, table, self._bytes, self._columns_bound(), self._used)
            self._used[key] = now

    def seed_rows(self, path: str, table: pa.Table) -> pa.Table:
        """Keep every column of the file just written at ``path`` (see ``_rows``); returns the
        rows as kept (buffers of their own), which ``seed`` then keeps without copying again."""
        bound = self.max_bytes // 4
        if table.nbytes > bound:
            return table
        table = _own_buffers(table)
        with self._lock:
            now = self._expire_idle()
            self._rows_bytes = _lru_put(self._rows, path, table, self._rows_bytes, bound, self._used)
            self._used[path] = now
        return table

    def rows(self, path: str) -> pa.Table | None:
        """The rows kept by ``seed_rows`` for ``path``, if still held; reads nothing."""
        with self._lock:
            now = self._expire_idle()
            hit = self._rows.get(path)
            if hit is not None:
                self._rows.move_to_end(path)
                self._used[path] = now
            return hit

    def _expire_idle(self) -> float:
        """Drop the key columns and kept rows not used for ``idle_s``; returns now (lock held)."""
        now = self._clock()
        if self.idle_s:
            cutoff = now - self.idle_s
            self._bytes -= _drop_idle(self._items, self._used, cutoff)
            self._rows_bytes -= _drop_idle(self._rows, self._used, cutoff)
        return now

    def forget(self, paths: Iterable[str]) -> None:
        """Drop everything kept for files a commit removed (merged data files, dropped delete
        files): reads are planned from the live snapshot, so they are not read again, and left to
        LRU eviction they filled the bound with dead files (a 20-minute soak: ~32k index entries)."""
        spilled: list[tuple[str, str]] = []
        with self._lock:
            for path in paths:
                self._rows_bytes -= _cost(self._rows.pop(path, None))
                self._used.pop(path, None)
                for columns in self._column_sets:
                    self._bytes -= _cost(self._items.pop((path, columns), None))
                    self._used.pop((path, columns), None)
                for column in self._filter_columns:
                    self._filters_bytes -= _cost(self._filters.pop((path, column), None))
                    spilled.append((path, column))
                self._split.pop(path, None)
        if self.spill is not None:
            self.spill.drop(spilled)

    #: The most of ``max_bytes`` key filters may take; the key columns have the rest, and at least
    #: this much. A filter holds 5-10 bytes a key and every lookup probes every large file's filter
    #: in the partitions it touches; a key-index entry holds ~40-60 bytes a key and a lookup reads
    #: only the few files whose filter may hold its keys (docs/architecture.md, the key-filter
    #: bullet of "What a commit costs").
    filter_share = 0.5

    def key_filter(self, path: str, column: str) -> KeyFilter | None:
        """The key filter of ``column`` of the data file at ``path``, if held: from memory, or read
        back from the spill (a small local read); never built here."""
        key = (path, column)
        with self._lock:
            hit = self._filters.get(key)
            if hit is not None:
                self._filters.move_to_end(key)
                return hit
        if self.spill is None:
            return None
        hit = self.spill.get(key)
        if hit is not None:
            self._keep_filter(key, hit)
        return hit

    def seed_filter(self, path: str, column: str, values: pa.Array | pa.ChunkedArray) -> None:
        """Keep the key filter of the data file at ``path`` whose ``column`` holds ``values`` (all
        rows); none for a file of fewer than ``min_filter_rows`` rows (read whole: cheaper)."""
        if self._wants_filter((path, column), len(values)):
            self._keep_filter((path, column), KeyFilter.build(values))

    def spill_filter(self, path: str, column: str, values: pa.Array | pa.ChunkedArray) -> None:
        """Keep that filter on the spill's disk, not in memory (``seed_filter`` without a spill): for
        a file no flush reads but a later lookup may. It comes into memory if a lookup asks for it
        (``key_filter``), so a worker that never looks its log up holds none of these in RSS."""
        if self.spill is None:
            self.seed_filter(path, column, values)
        elif self._wants_filter((path, column), len(values)) and (path, column) not in self.spill:
            self.spill.put((path, column), KeyFilter.build(values))

    def _wants_filter(self, key: tuple[str, str], rows: int) -> bool:
        """Filters are kept at all, the file is large enough for one, and it has none in memory yet."""
        return bool(self._filters_bound()) and rows >= self.min_filter_rows and key not in self._filters

    def _filters_bound(self) -> int:
        return int(self.max_bytes * self.filter_share)

    def _columns_bound(self) -> int:
        """What the key columns may hold now: what the filters leave (call with the lock held)."""
        return self.max_bytes - self._filters_bytes

    def _keep_filter(self, key: tuple[str, str], kf: KeyFilter) -> None:
        """Hold ``kf`` in memory, evicting the least recently used filters to the spill and key
        columns past ``max_bytes``; the spill is written outside the lock (one file a filter)."""
        bound = self._filters_bound()
        if kf.nbytes > bound:
            if self.spill is not None:
                self.spill.put(key, kf)
            return
        evicted: list[tuple[tuple[str, str], KeyFilter]] = []
        with self._lock:
            if key in self._filters:
                return
            self._filter_columns.add(key[1])
            self._filters[key] = kf
            self._filters_bytes += _cost(kf)
            while self._filters_bytes > bound:
                old = self._filters.popitem(last=False)
                self._filters_bytes -= _cost(old[1])
                evicted.append(old)
            while self._items and self._bytes > self._columns_bound():
                old_columns, table = self._items.popitem(last=False)
                self._used.pop(old_columns, None)
                self._bytes -= _cost(table)
        if self.spill is not None:
            for old_key, old_filter in evicted:
                self.spill.put(old_key, old_filter)

    def seed_split(self, path: str, split: dict[str, pa.Array]) -> None:
        """Keep a delete file's positions per data file, as written (sorted, unique)."""
        with self._lock:
            if self.max_bytes and path not in self._split:
                self._split[path] = split
                while len(self._split) > self.max_split_files:
                    self._split.popitem(last=False)


def _lru_put(items: OrderedDict[Any, Any], key: Any, table: Any, held: int, bound: int, used: dict[Any, float]) -> int:
    """Add ``table`` under ``key`` unless present (then it is the most recently used), evicting the
    least recently used entries past ``bound`` and their ``used`` times; returns the bytes ``items``
    holds now (``held`` before)."""
    if key in items:
        items.move_to_end(key)
        return held
    items[key] = table
    held += _cost(table)
    while held > bound:
        old_key, old = items.popitem(last=False)
        used.pop(old_key, None)
        held -= _cost(old)
    return held


def _drop_idle(items: OrderedDict[Any, Any], used: dict[Any, float], cutoff: float) -> int:
    """Drop the entries of ``items`` last used at or before ``cutoff`` (they lead: LRU order);
    returns the bytes they counted."""
    freed = 0
    while items:
        key = next(iter(items))
        if used.get(key, cutoff) > cutoff:
            break
        freed += _cost(items.pop(key))
        used.pop(key, None)
    return freed


def _cost(entry: Any) -> int:
    """What ``entry`` (a cached table or key filter; None: absent) counts against its bound."""
    return 0 if entry is None else entry.nbytes + FileCache.ENTRY_BYTES


def _own_buffers(table: pa.Table) -> pa.Table:
    """``table`` with buffers of its own when it is a view into larger ones (a slice); else itself."""
    if table.num_rows == 0 or table.get_total_buffer_size() <= table.nbytes + 4096:
        return table
    return pa.table([pa.concat_arrays(column.chunks) for column in table.columns], schema=table.schema)


def read_state(
    table: object,
    columns: Iterable[str],
    match: Matcher | None = None,
    cache: FileCache | None = None,
    row_filter: BooleanExpression | KeyScan | None = None,
) -> TableState:
    """Read the live rows' ``columns`` with their ``(_file, _pos)``, keeping rows ``match`` selects.

    ``match`` returns a boolean mask over a file's columns (for example: key in the batch's keys),
    so memory follows the batch, not the table. ``row_filter`` (an Iceberg expression, or a
    ``sinks.layout.KeyScan``, that selects at least every row ``match`` selects) prunes whole
    files by partition (bucket) and column statistics before anything is read: the state then covers only the
    files that may hold matching rows, and their delete files. ``cache`` keeps parsed files
    between flushes.

    With a ``KeyScan`` without truncated types and a bounded ``cache``, ``match`` must select only
    rows whose pk is one of the scan's keys' pks: the state still lists every file of a kept
    partition (and its deleted positions), but only the files whose key filter
    (``FileCache.key_filter``) may hold one of those pks are read into ``index``, so the lookup
    follows the batch, not the table. A file without a filter is read, and its filter kept.
    """
    from pyiceberg.table import Table

    assert isinstance(table, Table)
    state = TableState()
    if table.current_snapshot() is None:
        return state
    if isinstance(row_filter, KeyScan):
        schema, specs = table.schema(), table.specs()
        kept: dict[tuple[Any, ...], bool] = {}

        def keeps(df: DataFile) -> bool:
            # Decided once per (spec, partition): a partition holds up to ~16 small files and
            # their delete files, and the scan's check resolves the spec's fields each time.
            partition: Any = df.partition or ()
            where = (df.spec_id or 0, *partition)
            found = kept.get(where)
            if found is None:
                found = kept[where] = row_filter.keeps(df.partition, specs[df.spec_id or 0], schema)
            return found

        tasks = plan_live_files(table, keeps)
    else:
        planned = table.scan(row_filter=row_filter or AlwaysTrue()).plan_files()
        tasks = [LiveTask(t.file, frozenset(t.delete_files)) for t in planned]
    io = table.io
    cache = cache or FileCache(0)
    deletes: dict[str, list[pa.Array]] = {}
    for task in tasks:
        for df in task.delete_files:
            if df.file_path in state.delete_files:
                continue
            state.delete_files[df.file_path] = df
            per_file, hit = _delete_positions(cache, io, df.file_path)
            state.bytes_read += 0 if hit else df.file_size_in_bytes
            for path, pos in per_file.items():
                deletes.setdefault(path, []).append(pos)
            state.delete_positions[df.file_path] = per_file
    # One table over every file read (zero-copy), then one filter by ``match`` and one by the
    # deleted positions: per-file filtering cost ~10 compute calls per file and flush.
    cols = tuple(dict.fromkeys(columns))
    pks = _filtered_pk(row_filter, cols, cache)
    probes: dict[Any, Probe] = {}
    parts: list[pa.Table] = []
    sizes: list[int] = []
    paths: list[str] = []
    # Files read on their key filter's "maybe" (fid, and whether the cache had them): a use, and
    # kept when read from storage, only if they hold one of the keys.
    maybe: list[tuple[int, bool]] = []
    dead: list[pa.Array] = []  # deleted positions of the files read, and each one's file index
    dead_fids: list[int] = []
    for task in tasks:
        df = task.file
        dels = deletes.get(df.file_path)
        # Each delete file's positions of a data file are unique (``_delete_positions``); a file
        # named by one delete file, the common case, needs no compute call.
        deleted = (dels[0] if len(dels) == 1 else pc.unique(pa.concat_arrays(dels))) if dels else _NO_POSITIONS
        state.files[df.file_path] = LiveFile(df, deleted)
        kf = cache.key_filter(df.file_path, pks) if pks else None
        if kf is not None and not kf.may_hold(_probe(probes, row_filter, df, table)):
            continue
        t, hit = cache.get(io, df.file_path, cols, keep=kf is None, touch=kf is None)
        state.bytes_read += 0 if hit else df.file_size_in_bytes  # upper bound: only `cols` are read
        state.files_read += 1
        state.rows_read += t.num_rows
        if pks and kf is None:
            cache.seed_filter(df.file_path, pks, t.column(pks))
        if not t.num_rows:
            continue
        fid = len(paths)
        if kf is not None:
            maybe.append((fid, hit))
        paths.append(df.file_path)
        parts.append(t)
        sizes.append(t.num_rows)
        if len(deleted):
            dead.append(deleted)
            dead_fids.append(fid)
    if not parts:
        return state
    whole = _with_file_positions(pa.concat_tables(parts, promote_options="permissive"), sizes)
    if match is not None:
        whole = whole.filter(pc.fill_null(match(whole), False))
    if maybe:
        # A filter's false positive (a few in 10^4 keys, so most files now and then at a flush's
        # hundreds of keys) must not keep a file's key columns as if the flush needed them.
        held = set(pc.unique(whole.column("_fid")).to_pylist()) if whole.num_rows else set()
        touched: list[str] = []
        for f, hit in maybe:
            if f not in held:
                continue
            if hit:
                touched.append(paths[f])
            else:
                cache.seed(paths[f], cols, parts[f])
        cache.touch(touched, cols)
    if dead and whole.num_rows:
        keys = pc.add(whole.column("_pos"), pc.shift_left(whole.column("_fid").cast(pa.int64()), 32))
        whole = whole.filter(pc.invert(pc.is_in(keys, value_set=_file_position_keys(dead, dead_fids))))
    if whole.num_rows:
        files = pa.array(paths, pa.string()).take(whole.column("_fid"))
        state.index = whole.drop_columns(["_fid"]).append_column("_file", files)
    return state


_NO_POSITIONS = pa.array([], pa.int64())


def _with_file_positions(whole: pa.Table, sizes: list[int]) -> pa.Table:
    """``whole`` (files of ``sizes`` rows, concatenated) with each row's ``_pos`` in its file and
    ``_fid`` (the file's index), both int64. Pure.

    Built once over the concatenation (a run-end decode and a subtraction), not per file: two
    columns appended to every file read cost ~30 µs a file, and a small flush reads dozens.
    """
    ends = list(itertools.accumulate(sizes))
    fids = pc.run_end_decode(
        pa.RunEndEncodedArray.from_arrays(pa.array(ends, pa.int64()), pa.array(range(len(sizes)), pa.int64()))
    )
    starts = pa.array([end - size for end, size in zip(ends, sizes, strict=True)], pa.int64())
    pos = pc.subtract(positions(whole.num_rows), pc.take(starts, fids))
    return whole.append_column("_pos", pos).append_column("_fid", fids)


def _file_position_keys(positions_of: list[pa.Array], fids: list[int]) -> pa.Array:
    """``pos + (fid << 32)`` for every position of each file, the files' arrays concatenated. Pure.

    Built over the concatenation (three compute calls), not per file: on the partitioned layout a
    lookup reads every small file of the partitions it touches (up to ~16 each), most with deletes,
    and two calls a file were a tenth of the lookup.
    """
    sizes = [len(p) for p in positions_of]
    fid_of_row = pc.run_end_decode(
        pa.RunEndEncodedArray.from_arrays(
            pa.array(list(itertools.accumulate(sizes)), pa.int64()), pa.array(fids, pa.int64())
        )
    )
    every = pa.concat_arrays([p.cast(pa.int64()) if p.type != pa.int64() else p for p in positions_of])
    return pc.add(every, pc.shift_left(fid_of_row, 32))


def _filtered_pk(row_filter: object, columns: tuple[str, ...], cache: FileCache) -> str | None:
    """The pk column whose key filters prune the lookup's reads; None when they cannot: no key
    scan, a truncate (every row of its types is wanted), no cache to hold filters, pk not read."""
    if not isinstance(row_filter, KeyScan) or row_filter.types or not cache.max_bytes:
        return None
    return row_filter.pk_col if row_filter.pk_col in columns else None


def _probe(probes: dict[Any, Probe], scan: Any, df: DataFile, table: Any) -> Probe:
    """The flush's keys that may lie in ``df``'s partition: the batch hashed once, then a subset
    per partition (``probes`` holds both for the flush)."""
    partition: Any = df.partition or ()
    where = (df.spec_id or 0, tuple(partition))
    probe = probes.get(where)
    if probe is None:
        every = probes.get("*")
        if every is None:
            every = probes["*"] = Probe.of(pa.array(scan.pks(), pa.string()))
        at = scan.pk_positions_in(df.partition, table.specs()[df.spec_id or 0], table.schema())
        probe = probes[where] = every.subset(pa.array(at, pa.int64()))
    return probe


@dataclass(frozen=True)
class LiveTask:
    """A live data file and the position-delete files that apply to it (a scan task, unfiltered)."""

    file: DataFile
    delete_files: frozenset[DataFile]


def plan_live_files(table: Any, keep: Callable[[DataFile], bool] | None = None) -> list[LiveTask]:
    """The current snapshot's live data files that ``keep`` selects, each with its delete files.

    What ``table.scan().plan_files()`` returns for an unfiltered scan, built from the snapshot's
    manifests (parsed once per manifest: :mod:`sinks.manifest_cache`) with the rules of pyiceberg's
    ``DeleteFileIndex`` (a position-delete file applies to a data file of its spec and partition,
    or the one file it references, when its sequence number is not older and its file-path bounds
    hold the path), without a scan's evaluators and residuals: pyiceberg binds a metrics
    evaluator per (delete file, data file) pair, a third of the key lookup's time.
    """
    from pyiceberg.manifest import INITIAL_SEQUENCE_NUMBER
    from pyiceberg.table.delete_file_index import _partition_key, _referenced_data_file_path

    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    io = table.io
    by_partition: dict[tuple[int, Record], list[tuple[int, DataFile]]] = {}
    by_path: dict[str, list[tuple[int, DataFile]]] = {}
    data: list[ManifestEntry] = []
    for manifest in manifest_cache.manifests(snapshot, io):
        for entry in manifest_cache.entries(manifest, io):
            df = entry.data_file
            if df.content == DataFileContent.DATA:
                if keep is None or keep(df):
                    data.append(entry)
            elif df.content == DataFileContent.POSITION_DELETES:
                seq = entry.sequence_number or INITIAL_SEQUENCE_NUMBER
                target = _referenced_data_file_path(df)
                if target:
                    by_path.setdefault(target, []).append((seq, df))
                else:
                    by_partition.setdefault(_partition_key(df.spec_id or 0, df.partition), []).append((seq, df))
            else:
                raise ValueError(f"equality deletes are not supported: {df.file_path}")
    out: list[LiveTask] = []
    for e in data:
        df = e.data_file
        seq = e.sequence_number or INITIAL_SEQUENCE_NUMBER
        applies = [d for s, d in by_path.get(df.file_path, ()) if s >= seq]
        applies += [
            d
            for s, d in by_partition.get(_partition_key(df.spec_id or 0, df.partition), ())
            if s >= seq and _may_name(d, df)
        ]
        out.append(LiveTask(df, frozenset(applies)))
    return out


def _may_name(delete_file: DataFile, data_file: DataFile) -> bool:
    """pyiceberg's ``_applies_to_data_file`` (file-path bounds hold the path), without binding an
    evaluator per pair: a string compare of the bounds, the evaluator's rule for ``file_path = p``."""
    from pyiceberg.table.delete_file_index import PATH_FIELD_ID, _applies_to_data_file, _has_path_bounds

    if not _has_path_bounds(delete_file):
        return True
    try:
        lower = delete_file.lower_bounds[PATH_FIELD_ID].decode()
        upper = delete_file.upper_bounds[PATH_FIELD_ID].decode()
    except UnicodeDecodeError:
        return _applies_to_data_file(delete_file, data_file)
    return lower <= data_file.file_path <= upper


def _delete_positions(cache: FileCache, io: FileIO, path: str) -> tuple[dict[str, pa.Array], bool]:
    """``{data file: positions}`` of a position-delete file, split once per file (immutable) and kept."""
    with cache._lock:
        split = cache._split.get(path)
        if split is not None:
            cache._split.move_to_end(path)
            return split, True
    t, hit = cache.get(io, path, None)
    names = t.column("file_path")
    split = {}
    if t.num_rows:
        order = pc.sort_indices(names)  # stable: each file's positions keep their order
        names, pos = names.take(order), t.column("pos").take(order)
        counts = pc.value_counts(names)
        start = 0
        for value, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True):
            # Unique per data file (a lookup takes a file named by one delete file as it is);
            # causeway's writer never repeats a position, another writer might.
            split[value] = pc.unique(pos.slice(start, n).combine_chunks())
            start += n
    with cache._lock:
        if cache.max_bytes:
            cache._split[path] = split
            while len(cache._split) > cache.max_split_files:
                cache._split.popitem(last=False)
    return split, hit


_POSITIONS: list[pa.Array] = [pa.array([], pa.int64())]


def positions(n: int) -> pa.Array:
    """``0..n-1`` as int64 (cached: pyarrow has no arange and numpy is not a dependency)."""
    if len(_POSITIONS[0]) < n:
        _POSITIONS[0] = pa.array(range(max(n, 2 * len(_POSITIONS[0]))), pa.int64())
    return _POSITIONS[0].slice(0, n)


def write_position_deletes(
    io: object,
    location: str,
    deletes: dict[str, Iterable[int] | pa.Array],
    spec_id: int = 0,
    partition: Record | None = None,
    cache: FileCache | None = None,
) -> DataFile | None:
    """Write one position-delete file for ``{data file path: positions}``; None when empty.

    Every named data file must have the given ``spec_id`` and ``partition``: readers match
    position deletes to data files by (spec, partition), so a delete file never spans partitions
    (:func:`write_partition_deletes` splits them).
    """

    assert isinstance(io, FileIO)
    # Positions given as Python ints (every flush's) are sorted and made unique in Python and
    # become one array: three or four compute calls per data file named cost more than that at a
    # flush's few positions a file, and a partitioned flush writes a delete file per partition.
    names: list[str] = []
    counts: list[int] = []
    parts: list[pa.Array | list[int]] = []
    for path in sorted(deletes):
        p = deletes[path]
        if isinstance(p, pa.Array):
            arr = pc.unique(p)
            ordered: pa.Array | list[int] = arr.take(pc.array_sort_indices(arr)).cast(pa.int64())
        else:
            ordered = sorted(set(p))
        if len(ordered):
            names.append(path)
            counts.append(len(ordered))
            parts.append(ordered)
    if not names:
        return None
    if all(isinstance(part, list) for part in parts):
        positions_all = pa.array(list(itertools.chain.from_iterable(parts)), pa.int64())
    else:
        positions_all = pa.concat_arrays([p if isinstance(p, pa.Array) else pa.array(p, pa.int64()) for p in parts])
    split: dict[str, pa.Array] = {}
    start = 0
    for path, n in zip(names, counts, strict=True):
        split[path] = positions_all.slice(start, n)
        start += n
    file_paths = pa.array(
        list(itertools.chain.from_iterable([path] * n for path, n in zip(names, counts, strict=True))), pa.string()
    )
    table = pa.table({"file_path": file_paths, "pos": positions_all}, schema=DELETE_SCHEMA)
    with open_output(io, location) as f:
        # No Arrow schema in the footer and no Parquet statistics on file_path (both ~1.3 KiB of a
        # 275-position file's 2.7): a partitioned flush writes a delete file per partition, and
        # readers match them by the manifest's bounds (set below), not the footer.
        pq.write_table(table, f, compression="zstd", store_schema=False, write_statistics=["pos"])
        size = f.tell()  # the whole file, footer included: no stat of it after
    lower, upper = names[0].encode(), names[-1].encode()
    df = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=partition if partition is not None else Record(),
        record_count=table.num_rows,
        file_size_in_bytes=size,
        lower_bounds={FILE_PATH_ID: lower},
        upper_bounds={FILE_PATH_ID: upper},
    )
    df.spec_id = spec_id  # not an Avro field of DataFile: from_args would drop it
    if cache is not None:
        cache.seed_split(location, split)
    return df


def write_partition_deletes(
    table: object,
    files: Mapping[str, LiveFile] | None,
    deletes: Mapping[str, Iterable[int] | pa.Array],
    cache: FileCache | None = None,
) -> list[DataFile]:
    """Position-delete files for ``{data file path: positions}``: one per (spec, partition).

    ``files`` maps each named data file to its live state (its ``DataFile`` gives the spec and the
    partition); None looks them up in the table's current snapshot. Compaction and deletes
    therefore stay within a partition, as Iceberg requires.
    """
    from pyiceberg.table import Table

    assert isinstance(table, Table)
    if files is None:
        none = pa.array([], pa.int64())
        files = {
            t.file.file_path: LiveFile(t.file, none) for t in table.scan().plan_files() if t.file.file_path in deletes
        }
    groups: dict[tuple[int, tuple[object, ...]], tuple[Record, dict[str, Iterable[int] | pa.Array]]] = {}
    for path, pos in deletes.items():
        df = files[path].data_file
        partition = df.partition if df.partition is not None else Record()
        key: tuple[int, tuple[object, ...]] = (
            spec_of(df, table.metadata.default_spec_id),
            tuple(partition[i] for i in range(len(partition))),
        )
        groups.setdefault(key, (partition, {}))[1][path] = pos
    out: list[DataFile] = []
    for (spec_id, _), (partition, group) in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        written = write_position_deletes(table.io, new_delete_location(table), group, spec_id, partition, cache)
        if written is not None:
            out.append(written)
    return out


def deletes_to_merge(delete_files: Mapping[str, DataFile], live: Iterable[str], max_per_partition: int) -> list[str]:
    """The live delete files a flush merges: per (spec, partition), the smaller half (at least two)
    once the partition holds more than ``max_per_partition`` of them, counting the one the flush adds.

    Tiered, like an LSM, so a merge rewrites recent deletes rather than all of them. Counted per
    partition because a flush writes one delete file per partition it deletes from: a global count
    could not bound them (a merge's output is one file per partition). After a flush every
    partition holds at most ``max_per_partition`` delete files. Pure.
    """
    groups: dict[tuple[object, ...], list[str]] = {}
    for path in live:
        df = delete_files[path]
        partition: Any = df.partition or ()  # a pyiceberg Record: iterable, typed as not
        groups.setdefault((spec_of(df, -1), tuple(partition)), []).append(path)
    out: list[str] = []
    for _, paths in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        if len(paths) + 1 > max_per_partition:
            paths.sort(key=lambda d: (delete_files[d].record_count, d))
            out += paths[: max(2, len(paths) // 2)]
    return out


def partition_runs(df: pa.Table, spec: PartitionSpec, schema: Schema) -> list[pa.Table]:
    """``df`` cut into one slice per partition of ``spec`` (rows of a partition keep their order). Pure.

    pyiceberg's partitioned writer filters the whole table once per partition (O(partitions ×
    rows): with 32 (type, bucket) partitions, 8 % of a flush's CPU in a profile); a stable sort on
    the partition key and zero-copy slices cost one pass.
    """
    return [run for run, _ in _keyed_runs(df, spec, schema)]


def _keyed_runs(df: pa.Table, spec: PartitionSpec, schema: Schema) -> list[tuple[pa.Table, list[Any]]]:
    """:func:`partition_runs` with each run's transformed partition values (its first row's)."""
    if spec.is_unpartitioned() or df.num_rows == 0:
        return [(df, [])]
    codes: pa.Array | None = None
    transformed: list[pa.Array] = []
    for f in spec.fields:
        column = schema.find_column_name(f.source_id)
        values = f.transform.pyarrow_transform(schema.find_field(f.source_id).field_type)(
            df.column(column).combine_chunks()
        )
        transformed.append(values)
        encoded = pc.dictionary_encode(values, null_encoding="encode")
        index = encoded.indices.cast(pa.int64())
        codes = index if codes is None else pc.add(pc.multiply(codes, len(encoded.dictionary)), index)
    assert codes is not None
    order: pa.Array | None = None
    if len(codes) > 1 and not pc.all(pc.greater_equal(codes[1:], codes[:-1])).as_py():
        order = pc.sort_indices(codes)  # stable
    # Rows already grouped (one partition: every log merge, most flushes of one type) are sliced
    # as they are: the take copied the whole table, a second copy of a merge's rows at its peak.
    ordered, sorted_codes = (df, codes) if order is None else (df.take(order), codes.take(order))
    counts = pc.value_counts(sorted_codes).field("counts").to_pylist()  # in order of appearance: sorted
    out, start = [], 0
    for n in counts:
        first = start if order is None else order[start].as_py()
        out.append((ordered.slice(start, n), [values[first].as_py() for values in transformed]))
        start += n
    return out


class _KnownPathKey(PartitionKey):
    """A partition key whose directory (``type=person/bucket=3``) is derived once per partition:
    pyiceberg's ``to_path`` builds the spec's partition type (pydantic models) for every file, 2-3 %
    of a small commit's CPU."""

    def to_path(self) -> str:
        spec, schema = self.partition_spec, self.schema
        key = (
            tuple(spec.fields),
            tuple(schema.find_field(f.source_id).field_type for f in spec.fields),
            tuple(v.value for v in self.field_values),
        )
        with _PATHS_LOCK:
            path = _PATHS.get(key)
        if path is None:
            path = super().to_path()
            with _PATHS_LOCK:
                if len(_PATHS) >= _PATHS_MAX:
                    _PATHS.clear()
                _PATHS[key] = path
        return path


#: Partition directories by (spec fields, their source types, values); (type, bucket) partitions: a few hundred.
_PATHS: dict[tuple[Any, ...], str] = {}
_PATHS_MAX = 4096
_PATHS_LOCK = threading.Lock()


def write_data_files(metadata: Any, df: pa.Table, io: FileIO) -> list[DataFile]:
    """:func:`write_data_files_with_rows`, the files only."""
    return [data_file for data_file, _ in write_data_files_with_rows(metadata, df, io)]


@dataclass(frozen=True)
class PartitionSplit:
    """Rows cut by partition of ``spec`` (:func:`split_rows`): each run with its transformed
    partition values. Made once per batch of rows and handed to the writer (:func:`write_split`),
    so a caller that decides by the partition count does not pay a second split."""

    spec: PartitionSpec
    runs: list[tuple[pa.Table, list[Any]]]

    @property
    def partitions(self) -> int:
        return sum(1 for run, _ in self.runs if run.num_rows)

    @property
    def num_rows(self) -> int:
        return sum(run.num_rows for run, _ in self.runs)


def split_rows(df: pa.Table, spec: PartitionSpec, schema: Schema) -> PartitionSplit:
    """``df`` cut by partition of ``spec`` (:func:`partition_runs`, with the values). Pure."""
    return PartitionSplit(spec, _keyed_runs(df, spec, schema))


def joined(first: PartitionSplit, second: PartitionSplit) -> PartitionSplit:
    """The split of ``first``'s rows followed by ``second``'s (same spec): each partition's runs
    concatenated, ``first``'s rows first, as a split of the concatenated rows would hold them. Pure."""
    if first.spec.spec_id != second.spec.spec_id:
        raise ValueError(f"splits of specs {first.spec.spec_id} and {second.spec.spec_id} cannot be joined")
    by_key: dict[tuple[Any, ...], tuple[list[pa.Table], list[Any]]] = {}
    for run, values in (*first.runs, *second.runs):
        if run.num_rows:
            by_key.setdefault(tuple(values), ([], values))[0].append(run)
    runs = [(parts[0] if len(parts) == 1 else pa.concat_tables(parts), values) for parts, values in by_key.values()]
    return PartitionSplit(first.spec, runs)


def write_data_files_with_rows(
    metadata: Any, df: pa.Table, io: FileIO, spec: PartitionSpec | None = None
) -> list[tuple[DataFile, pa.Table]]:
    """Data files of ``df`` under the current spec of ``metadata`` (or ``spec``, one of its specs),
    with the rows each one holds: :func:`write_split` of :func:`split_rows`."""
    return write_split(metadata, split_rows(df, metadata.spec() if spec is None else spec, metadata.schema()), io)


def write_split(metadata: Any, split: PartitionSplit, io: FileIO) -> list[tuple[DataFile, pa.Table]]:
    """Data files of rows already split by partition (``split.spec`` is one of ``metadata``'s
    specs), with the rows each one holds.

    Rows are split by partition once (:func:`partition_runs`) and cut at the table's target size
    as pyiceberg cuts them; :class:`sinks.datafiles.FileWriter` writes every file with one set-up
    (pyiceberg's writer paid its schema conversions and statistics plan per file, and called once
    per partition also a group-by and a pool round: the partitioned layout's extra commit CPU,
    issue 21).
    """
    from pyiceberg.io.pyarrow import bin_pack_arrow_table
    from pyiceberg.partitioning import PartitionFieldValue
    from pyiceberg.table import TableProperties
    from pyiceberg.utils.concurrent import ExecutorFactory
    from pyiceberg.utils.properties import property_as_int

    from sinks.datafiles import FileWriter

    if split.num_rows == 0:
        return []
    spec, schema = split.spec, metadata.schema()
    target: int = property_as_int(  # type: ignore[assignment]
        metadata.properties,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
    )
    writer = FileWriter(metadata, io, spec.spec_id)
    chunks: list[tuple[pa.Table, PartitionKey | None]] = []
    for run, values in split.runs:
        if not run.num_rows:
            continue
        key = (
            None
            if spec.is_unpartitioned()
            else _KnownPathKey(
                field_values=[PartitionFieldValue(field=f, value=v) for f, v in zip(spec.fields, values, strict=True)],
                partition_spec=spec,
                schema=schema,
            )
        )
        for batches in bin_pack_arrow_table(run.combine_chunks(), target):
            chunks.append((pa.Table.from_batches(batches), key))
    files = writer.write(chunks, ExecutorFactory.get_or_create())
    return list(zip(files, (rows for rows, _ in chunks), strict=True))


def new_delete_location(table: object) -> str:
    from pyiceberg.table import Table

    assert isinstance(table, Table)
    return table.location_provider().new_data_location(f"delete-{uuid.uuid4()}.parquet")


def spec_of(df: DataFile, default: int) -> int:
    """The spec id of a data file; ``default`` for a file just written (pyiceberg leaves it unset)."""
    try:
        return df.spec_id or 0
    except AttributeError:
        return default


class RowDelta(_SnapshotProducer["RowDelta"]):
    """One snapshot that adds data and delete files and removes data and delete files.

    Usage inside a pyiceberg ``Transaction``::

        rd = RowDelta(tx, snapshot_properties={...})
        rd.add(data_files); rd.add(delete_files); rd.remove(obsolete_files)
        rd.commit()
    """

    max_manifests = 16

    def __init__(self, transaction: Transaction, snapshot_properties: dict[str, str] | None = None) -> None:
        super().__init__(
            Operation.OVERWRITE,
            transaction,
            transaction._table.io,
            snapshot_properties=dict(snapshot_properties or {}),
        )
        self._added_deletes: list[DataFile] = []
        self._removed: set[str] = set()
        self._removed_files: list[DataFile] = []
        self._wrote: dict[str, list[ManifestEntry]] = {}  # manifest path -> entries, as written
        self._listed: list[ManifestFile] = []
        # pyiceberg builds the table's location provider for every manifest and list it names; it
        # depends on the transaction's base table alone, fixed for this snapshot.
        self._locations = transaction._table.location_provider()

    def add(self, files: Iterable[DataFile]) -> RowDelta:
        for df in files:
            if df.content == DataFileContent.DATA:
                self._added_data_files.append(df)
            else:
                self._added_deletes.append(df)
        return self

    def remove(self, files: Iterable[DataFile]) -> RowDelta:
        for df in files:
            if df.file_path not in self._removed:
                self._removed.add(df.file_path)
                self._removed_files.append(df)
                self._deleted_data_files.add(df)
        return self

    @property
    def empty(self) -> bool:
        return not (self._added_data_files or self._added_deletes or self._removed)

    def _summary(self, snapshot_properties: dict[str, str] | None = None) -> Summary:
        # pyiceberg's own summary counts added files under the current spec only; after a partition
        # evolution a delete file of an older file keeps that file's spec (a spec with fewer fields
        # failed in partition_to_path), so every file, delete files included, counts under its own.
        metadata = self._transaction.table_metadata
        schema, specs, default = metadata.schema(), metadata.specs(), metadata.default_spec_id
        limit = metadata.properties.get(
            TableProperties.WRITE_PARTITION_SUMMARY_LIMIT, TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT
        )
        ssc = _SummaryCollector(partition_summary_limit=int(limit))
        for df in [*self._added_data_files, *self._added_deletes]:
            ssc.add_file(data_file=df, partition_spec=specs[spec_of(df, default)], schema=schema)
        for df in self._deleted_data_files:
            ssc.remove_file(data_file=df, partition_spec=specs[spec_of(df, default)], schema=schema)
        parent = metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id is not None else None
        totals = _Totals(ssc.build(), **(snapshot_properties or {}))
        totals.operation = self._operation
        update_snapshot_summaries(summary=totals, previous_summary=_previous(parent))  # type: ignore[arg-type]
        return Summary(operation=totals.operation, **totals)

    def _deleted_entries(self) -> list[ManifestEntry]:
        return []

    def _existing_manifests(self) -> list[ManifestFile]:
        return []

    def new_manifest_output(self) -> OutputFile:
        """pyiceberg's manifest location, written through :class:`sinks.fileio.SizedOutputFile`: no
        ``create_dir`` before the open, no stat for the manifest's length, and no pyiceberg output
        file (a URI parse) built for its location alone."""
        name = _new_manifest_file_name(num=next(self._manifest_num_counter), commit_uuid=self.commit_uuid)
        path = self._locations.new_metadata_location(name)
        self._written_manifests.append(path)
        return SizedOutputFile(self._io, path)

    def _writer(self, content: ManifestContent, spec_id: int | None = None) -> ManifestWriter:
        metadata = self._transaction.table_metadata
        spec = metadata.spec() if spec_id is None else metadata.specs()[spec_id]
        output = self.new_manifest_output()
        return ManifestWriter(spec, self.schema(), output, self._snapshot_id, self._compression, content)

    def _commit(self) -> UpdatesAndRequirements:
        # Iceberg's row-delta operation: only data files added is an append (what pyiceberg's
        # append wrote for the log, and what incremental readers such as Spark's streaming source
        # take); anything deleted or removed is an overwrite.
        if self._added_data_files and not self._added_deletes and not self._removed:
            self._operation = Operation.APPEND
        if self._transaction.table_metadata.format_version == 2 and self._target_branch is not None:
            updates, requirements = self._commit_v2()
        else:
            updates, requirements = super()._commit()
        # The next flush plans from this snapshot: give the manifest cache the list and the
        # manifests written here instead of letting it read them back (~4 Avro reads a commit).
        for update in updates:
            if isinstance(update, AddSnapshotUpdate):
                listed = [_as_listed(m, update.snapshot) for m in self._listed]
                manifest_cache.remember_list(update.snapshot, listed)
                for m in listed:
                    if m.manifest_path in self._wrote:
                        manifest_cache.remember(m, self._wrote[m.manifest_path])
        return updates, requirements

    def _commit_v2(self) -> UpdatesAndRequirements:
        """pyiceberg's ``_SnapshotProducer._commit`` for a v2 table and a branch, its manifest list
        written by :class:`sinks.manifest_write.ManifestListWriter` (the Avro set-up kept, not
        derived again for every list)."""
        metadata = self._transaction.table_metadata
        manifests = self._manifests()
        sequence_number = metadata.next_sequence_number()
        summary = self._summary(self.snapshot_properties)
        name = _new_manifest_list_file_name(snapshot_id=self._snapshot_id, attempt=0, commit_uuid=self.commit_uuid)
        path = self._locations.new_metadata_location(name)
        self._written_manifest_lists.append(path)
        out = SizedOutputFile(self._io, path)
        with ManifestListWriter(
            out, self._snapshot_id, self._parent_snapshot_id, sequence_number, self._compression
        ) as writer:
            writer.add_manifests(manifests)
        snapshot = Snapshot(  # type: ignore[call-arg]
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            manifest_list=path,
            sequence_number=sequence_number,
            summary=summary,
            schema_id=metadata.current_schema_id,
        )
        branch = self._target_branch
        assert branch is not None
        ref = metadata.refs.get(branch)
        return (
            (
                AddSnapshotUpdate(snapshot=snapshot),
                SetSnapshotRefUpdate(  # type: ignore[call-arg]
                    snapshot_id=self._snapshot_id,
                    parent_snapshot_id=self._parent_snapshot_id,
                    ref_name=branch,
                    type=SnapshotRefType.BRANCH,
                ),
            ),
            (AssertRefSnapshotId(snapshot_id=ref.snapshot_id if ref is not None else None, ref=branch),),  # type: ignore[call-arg]
        )

    def _manifests(self) -> list[ManifestFile]:
        """The new snapshot's manifests: untouched ones kept, touched ones rewritten per spec.

        A manifest holds the files of one partition spec, so after partition evolution the
        entries of older specs are rewritten into manifests of their own spec (never re-labelled
        with the current one), and added files go to manifests of the spec they were written with.
        """
        metadata = self._transaction.table_metadata
        parent = metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id else None
        previous = manifest_cache.manifests(parent, self._io) if parent else []
        kept: list[ManifestFile] = []
        Group = tuple[ManifestContent, int]
        removed_entries: dict[Group, list[ManifestEntry]] = {}
        surviving: dict[Group, list[ManifestEntry]] = {}
        added: dict[Group, list[DataFile]] = {}
        default = metadata.default_spec_id
        for df in self._added_data_files:
            added.setdefault((ManifestContent.DATA, spec_of(df, default)), []).append(df)
        for df in self._added_deletes:
            added.setdefault((ManifestContent.DELETES, spec_of(df, default)), []).append(df)
        consolidate = len(previous) + len(added) > self.max_manifests
        for manifest in previous:
            if not consolidate and not self._removed:
                kept.append(manifest)
                continue
            entries = manifest_cache.entries(manifest, self._io)
            hit = [e for e in entries if e.data_file.file_path in self._removed]
            if not hit and not consolidate:
                kept.append(manifest)
                continue
            group = (manifest.content, manifest.partition_spec_id)
            for e in entries:
                bucket = removed_entries if e.data_file.file_path in self._removed else surviving
                bucket.setdefault(group, []).append(e)
        out = list(kept)
        for group in sorted(set(removed_entries) | set(surviving) | set(added), key=lambda g: (g[0].value, g[1])):
            content, spec_id = group
            writer = self._writer(content, spec_id)
            with writer:
                for df in added.get(group, ()):
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, data_file=df
                        )
                    )
                for e in surviving.get(group, ()):
                    writer.existing(e)
                for e in removed_entries.get(group, ()):
                    writer.delete(e)
            written = writer.to_manifest_file()
            self._wrote[written.manifest_path] = writer.entries
            out.append(written)
        self._listed = out
        return out


class _Totals(dict[str, str]):
    """A new snapshot's summary properties as a plain dict with the operation beside them: what
    pyiceberg's ``update_snapshot_summaries`` reads (``operation``, ``get``) and writes (the
    totals), its rules unchanged.

    Run on pyiceberg's ``Summary`` (a pydantic model read as a mapping: every ``get`` goes through
    ``Mapping.get``, a key's ``lower()`` and a pydantic private attribute), its 12 reads and 6
    writes cost ~150 µs a snapshot, 3 snapshots a commit; on dicts ~35 µs.
    """

    __slots__ = ("operation",)
    operation: Operation


def _previous(parent: Snapshot | None) -> dict[str, str] | None:
    """The parent's summary as the plain mapping ``update_snapshot_summaries`` reads totals from.

    The operation stays in it: a ``Summary`` with no other property still counts as a previous
    summary there (it is not empty), so its totals are not started again from zero."""
    if parent is None or parent.summary is None:
        return None
    return {**parent.summary.additional_properties, "operation": parent.summary.operation.value}


class _SummaryCollector(SnapshotSummaryCollector):
    """pyiceberg's snapshot summary collector, each partition's path derived once per table schema
    and spec (``manifest_write.spec_facts``), not per file.

    pyiceberg derives the path (``type=person/bucket=3``, the key of its per-partition counts) for
    every file added or removed, building the spec's partition type (pydantic models) each time;
    a small commit on the partitioned layout adds and removes several files per partition, and a
    world's next commit touches the same partitions.
    """

    def update_partition_metrics(
        self, partition_spec: PartitionSpec, file: DataFile, is_add_file: bool, schema: Schema
    ) -> None:
        path = spec_facts(schema, partition_spec).path(file.partition)
        metrics = self.partition_metrics[path]
        if is_add_file:
            metrics.add_file(file)
        else:
            metrics.remove_file(file)


def _as_listed(manifest: ManifestFile, snapshot: Any) -> ManifestFile:
    """``manifest`` as the manifest list of ``snapshot`` holds it: the list writer assigns the
    snapshot's sequence number to a manifest written in its commit (pyiceberg's
    ``ManifestListWriterV2.prepare_manifest``)."""
    from copy import copy

    if manifest.sequence_number != UNASSIGNED_SEQ and manifest.min_sequence_number != UNASSIGNED_SEQ:
        return manifest
    listed = copy(manifest)
    if listed.sequence_number == UNASSIGNED_SEQ:
        listed.sequence_number = snapshot.sequence_number
    if listed.min_sequence_number == UNASSIGNED_SEQ:
        listed.min_sequence_number = snapshot.sequence_number
    return listed
