"""Compaction of the event log inside its partitions: small files merged into sorted runs.

Every flush appends one small ``entity_events`` file per day it touches. Left alone, the log grows
by a file per commit and an entity's audit trail has to open all of them, because a file written
by one flush spans the whole key range. Compaction rewrites a partition's small files into files
sorted by the log's sort order ``(entity_type, entity_pk, version)`` and cut at the target file
size, so each output file holds a narrow, disjoint key range and min/max statistics prune an
entity's reads to about one file per partition and size tier.

The policy is tiered (like an LSM tree), so a row is rewritten a bounded number of times: files
are grouped by partition and by size tier (tier ``k`` holds files of ``FANOUT**k`` rows up to the
next power), and a tier is merged once it holds ``FANOUT`` files; the merged output lands about
one tier up, or is cut into full-size files. A row is therefore rewritten at most
``log_FANOUT(target / flush file size)`` times (about 3 for 64 MiB targets and 100 KiB flush
files). Files of at least half the merge bound below (counted in rows at the flush's in-memory
row size, the measure pyiceberg cuts files by; at most half the target) are never compacted
again. Everything happens in the flush's own transaction, published with its Nessie commit;
compaction never crosses a partition
(files of an older spec are compacted among themselves and rewritten under the current spec,
which is how an evolved log migrates).

One merge is bounded in rows and in in-memory bytes (``CAUSEWAY_LOG_MERGE_MAX_ROWS``,
``CAUSEWAY_LOG_MERGE_MAX_BYTES``): a full tier is packed into as many merges as it needs, not merged whole, because
the merge's transient tables (its inputs, the sorted copy, the writer's copies) are what the
worker's allocator keeps afterwards. The flush files
are already sorted runs, so runs whose key ranges do not overlap are concatenated as they are;
only overlapping runs are sorted (and everything is, when a run is not sorted).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: A tier is merged once it holds this many files.
FANOUT = 8
#: Size of tier 0's upper bound, bytes.
TIER_BASE_BYTES = 1024


@dataclass(frozen=True)
class Candidate:
    """A data file of the log: where it lives, its partition group and size."""

    path: str
    group: tuple[Any, ...]  # (spec id, partition values)
    size: int


def small_file(path: str, df: Any) -> Candidate:
    """A data file as a compaction candidate, grouped by its spec and partition."""
    from sinks.rowdelta import spec_of

    return Candidate(path, (spec_of(df, -1), tuple(df.partition or ())), df.file_size_in_bytes)


def tier(size: int, base: int = TIER_BASE_BYTES) -> int:
    """The size tier of a file of ``size`` (bytes, or rows with ``base=1``)."""
    return 0 if size <= base else int(math.log(size / base, FANOUT))


def choose(
    files: list[Candidate],
    small_below: int,
    fanout: int = FANOUT,
    base: int = TIER_BASE_BYTES,
    max_size: int | None = None,
) -> list[list[str]]:
    """Groups of files to merge: per (partition, tier), at least ``fanout`` files under ``small_below``.

    Pure. Emptiest tiers first, so a budget spent in order goes to the smallest files. With
    ``max_size`` a full tier is packed, smallest files first, into groups of at most ``max_size``
    (sizes summed) and at least two files; a file that fits no group waits for the next merge.
    """
    by: dict[tuple[Any, ...], list[Candidate]] = {}
    for f in files:
        if f.size < small_below:
            by.setdefault((f.group, tier(f.size, base)), []).append(f)
    full = [(key, group) for key, group in by.items() if len(group) >= fanout]
    full.sort(key=lambda kg: (kg[0][1], repr(kg[0][0])))
    if max_size is None:
        return [sorted(c.path for c in group) for _, group in full]
    return [sorted(c.path for c in packed) for _, group in full for packed in pack(group, max_size)]


def pack(files: list[Candidate], max_size: int) -> list[list[Candidate]]:
    """``files``, smallest first, in consecutive groups of at most ``max_size`` summed size. Pure.

    A group of one file merges nothing: it is dropped (the file waits for the tier's next merge).
    """
    rest = sorted(files, key=lambda c: (c.size, c.path))
    groups: list[list[Candidate]] = []
    while rest:
        group = within(rest, max_size) or rest[:1]
        groups.append(group)
        rest = rest[len(group) :]
    return [g for g in groups if len(g) > 1]


def within(files: list[Candidate], room: float) -> list[Candidate]:
    """The longest prefix of ``files`` whose sizes sum to at most ``room``. Pure.

    How much of a full tier one merge takes, for both merges of small files. They bound it
    differently, and that is why the rest of their plans differ: the log bounds each merge (its
    transient rows are the worker's memory), so a tier is cut into as many merges as it needs, and
    one that stays in its tier is merged again later; the projections bound the rows a whole flush
    rewrites (its commit time, ``Compaction.pick``'s budget), so a tier takes what the flush has
    left, and only if that lifts it (:func:`lifts`), since a flush that merges a tier's start back
    into the tier pays for it again at the next flush.
    """
    out: list[Candidate] = []
    total = 0
    for f in files:
        if total + f.size > room:
            break
        out.append(f)
        total += f.size
    return out


def lifts(sizes: list[int], base: int = TIER_BASE_BYTES) -> bool:
    """Whether merging files of ``sizes`` (all of one size tier) makes a file of a higher tier. Pure."""
    return len(sizes) > 1 and tier(sum(sizes), base) > tier(max(sizes), base)


def merge_bound(row_bytes: float, max_rows: int, max_bytes: int) -> int:
    """Rows one log merge may hold: at most ``max_rows``, and ``max_bytes`` of in-memory rows."""
    return max(2, min(max_rows, int(max_bytes / row_bytes)))


def done_rows(target_file_bytes: int, row_bytes: float, bound: int) -> int:
    """Rows from which a log file is never merged again: half a target file, or half the merge bound.

    A file of half the bound fits no merge with another one of its size anyway; a target file's
    worth is cut into files with disjoint key ranges, which is what the merges are for.
    """
    return max(1, min(int(target_file_bytes / row_bytes), bound) // 2)


#: A merge holds its inputs, one sorted copy and the writer's copy of each output file at once.
MERGE_COPIES = 3


def merge_transient_bytes(files: dict[str, Any], paths: list[str], row_bytes: float | None) -> int:
    """Bytes of transient Arrow tables a merge of ``paths`` makes, estimated. Pure.

    At ``row_bytes`` (the flush's in-memory row size) per record; without it, at the files'
    on-disk size, which understates the rows several times (the caller bounds such merges by it).
    """
    if row_bytes:
        rows = sum(files[p].record_count for p in paths)
        return int(MERGE_COPIES * rows * row_bytes)
    return MERGE_COPIES * sum(files[p].file_size_in_bytes for p in paths)


def merge_runs(parts: list[pa.Table], sort_keys: list[tuple[str, str]]) -> pa.Table:
    """``parts`` (one schema) as one table in ``sort_keys`` order (ascending keys); empties ``parts``.

    Pure. The log's files are sorted runs: runs whose key ranges do not overlap are kept as they
    are (zero-copy slices of the result), and only each cluster of overlapping runs is sorted.
    Any run not sorted, or with a null key, sorts the lot. The list is emptied so that the caller
    holds no run: a sorted cluster's runs are freed once they are copied, before the sorted copy
    is made (peak twice the cluster, not three times).
    """
    names = [k for k, _ in sort_keys]
    runs = [p for p in parts if p.num_rows]
    empty = parts[0].schema.empty_table() if parts else pa.table({})
    parts.clear()
    if not runs:
        return empty
    if any(order != "ascending" for _, order in sort_keys) or not all(is_sorted(r, names) for r in runs):
        return _sorted(runs, sort_keys)
    bounds = [(_key(r, names, 0), _key(r, names, r.num_rows - 1), r) for r in runs]
    bounds.sort(key=lambda b: b[0])
    runs.clear()
    clusters: list[list[pa.Table]] = []
    high: tuple[Any, ...] = ()
    for low, last, run in bounds:
        if clusters and low < high:
            clusters[-1].append(run)
            high = max(high, last)
        else:
            clusters.append([run])
            high = last
    del bounds, run
    return pa.concat_tables([c.pop() if len(c) == 1 else _sorted(c, sort_keys) for c in clusters])


def is_sorted(table: pa.Table, names: list[str]) -> bool:
    """Whether ``table``'s rows are in ascending order of the columns ``names`` and none is null. Pure."""
    if any(table.column(n).null_count for n in names):
        return False
    if table.num_rows < 2:
        return True
    head, tail = table.slice(0, table.num_rows - 1), table.slice(1)
    ordered: Any = None  # per adjacent pair: head <= tail on the keys from this one on
    for n in reversed(names):
        a, b = head.column(n), tail.column(n)
        ordered = pc.less_equal(a, b) if ordered is None else pc.or_(pc.less(a, b), pc.and_(pc.equal(a, b), ordered))
    return bool(pc.all(ordered).as_py())


def _key(table: pa.Table, names: list[str], row: int) -> tuple[Any, ...]:
    return tuple(table.column(n)[row].as_py() for n in names)


def _sorted(cluster: list[pa.Table], sort_keys: list[tuple[str, str]]) -> pa.Table:
    """The rows of ``cluster`` sorted; empties it. Arrow's ``take`` on chunked columns concatenates
    them first, so the runs are combined here and let go before the sorted copy is made."""
    combined = pa.concat_tables(cluster).combine_chunks()
    cluster.clear()
    return combined.take(pc.sort_indices(combined, sort_keys=sort_keys))


def cut(table: pa.Table, target_file_bytes: int) -> list[pa.Table]:
    """Split a sorted table into consecutive slices of about ``target_file_bytes`` (in-memory bytes)."""
    if not table.num_rows:
        return []
    per_row = max(1.0, table.nbytes / table.num_rows)
    rows = max(1, int(target_file_bytes / per_row))
    return [table.slice(i, rows) for i in range(0, table.num_rows, rows)]


def live_data_files(metadata: Any, io: Any) -> dict[str, Any]:
    """``{path: DataFile}`` of the current snapshot's live data files, read from its data manifests.

    What ``DataScan.plan_files`` lists for a table without a filter, without building a scan plan
    (delete index, evaluators, one task per file): compaction reads whole files, so the files are
    all it needs. Manifest entries come from :mod:`sinks.manifest_cache`, so only manifests
    written since the last flush are decoded.
    """
    from pyiceberg.manifest import ManifestContent

    return _live_files(metadata, io, ManifestContent.DATA)


def live_delete_files(metadata: Any, io: Any) -> dict[str, Any]:
    """``{path: DataFile}`` of the current snapshot's live delete files (the log has none today)."""
    from pyiceberg.manifest import ManifestContent

    return _live_files(metadata, io, ManifestContent.DELETES)


def _live_files(metadata: Any, io: Any, content: Any) -> dict[str, Any]:
    from sinks import manifest_cache

    snapshot = metadata.current_snapshot()
    if snapshot is None:
        return {}
    out: dict[str, Any] = {}
    for manifest in manifest_cache.manifests(snapshot, io):
        if manifest.content == content:
            for entry in manifest_cache.entries(manifest, io):
                out[entry.data_file.file_path] = entry.data_file
    return out


def unmasked(files: list[Candidate], deletes: list[Candidate]) -> list[Candidate]:
    """The files no delete file may apply to: outside every partition that holds a delete file. Pure.

    A merge reads whole data files without applying deletes, so merging a file a delete applies
    to would bring its deleted rows back (a position delete would also point at a removed file).
    The log is append-only, so this leaves nothing out today; it keeps a future writer of log
    deletes correct. A delete file of an unpartitioned spec may apply anywhere: nothing is merged.
    """
    masked = {d.group for d in deletes}
    if any(not partition for _, partition in masked):
        return []
    return [f for f in files if f.group not in masked]


def compact_log(
    tx: Any,
    target_file_bytes: int,
    stats: Any | None = None,
    fanout: int = FANOUT,
    row_bytes: float | None = None,
    cache: Any | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    budget: Any | None = None,
) -> int:
    """Merge the log's small files per partition and tier inside ``tx``; returns files removed.

    ``stats`` (a ``FlushStats``) gets the rows and bytes rewritten and read. ``row_bytes`` (the
    in-memory bytes of a row, from the flush's own rows) lets tiers count rows: pyiceberg cuts
    files at in-memory bytes, which on disk come out several times smaller. ``cache`` (the
    committer's ``FileCache``) holds the rows of small files the flushes wrote: those are not read
    back from storage, and the merged ones are dropped from it. ``max_rows`` and ``max_bytes``
    (``Settings.log_merge_max_rows``, ``log_merge_max_bytes``: in-memory bytes at ``row_bytes``)
    bound one merge; without ``row_bytes``, ``max_bytes`` bounds the merged files' bytes. ``budget``
    (the worker's ``streams.memory.NativeBudget``) makes each merge wait until its transients fit
    beside other worlds' merges: several at once are the worker's memory peaks.
    """
    from sinks.loglookup import COLUMNS
    from sinks.rowdelta import RowDelta, write_data_files_with_rows
    from sinks.rows import EVENTS_SORT
    from sinks.tables import arrow_schema

    metadata = tx.table_metadata
    if metadata.current_snapshot() is None:
        return 0
    table = tx._table
    files = live_data_files(metadata, table.io)
    deletes = [small_file(p, df) for p, df in live_delete_files(metadata, table.io).items()]
    candidates = unmasked([small_file(p, df) for p, df in files.items()], deletes)
    if row_bytes:
        # Measured in rows: a file cut at the target size holds target / row_bytes rows, whatever
        # its compressed size on disk, so it counts as done; any two files under done fit a merge.
        bound = merge_bound(row_bytes, max_rows or 2**62, max_bytes or 2**62)
        rows = [replace(c, size=files[c.path].record_count) for c in candidates]
        done = done_rows(target_file_bytes, row_bytes, bound)
        merges = choose(rows, done, fanout, base=1, max_size=bound)

        def final(df: Any) -> bool:
            return bool(df.record_count >= done)
    else:
        merges = choose(candidates, target_file_bytes // 2, fanout, max_size=max_bytes)

        def final(df: Any) -> bool:
            return bool(df.file_size_in_bytes >= target_file_bytes // 2)

    if not merges:
        return 0
    rd = RowDelta(tx, {"causeway.compaction": "log"})
    schema = arrow_schema(metadata.schema())
    sort_keys = [k for k in EVENTS_SORT if k[0] in schema.names]
    removed = 0
    for paths in merges:
        with budget.hold(merge_transient_bytes(files, paths, row_bytes)) if budget is not None else nullcontext():
            merged, bytes_read = _merged_rows(table, paths, files, schema, sort_keys, cache)
            # Dropped as soon as its files exist: a commit's largest transient, and whatever is alive
            # at once is what the allocator keeps.
            written = [
                pair
                for chunk in cut(merged, target_file_bytes)
                for pair in write_data_files_with_rows(metadata, chunk, table.io)
            ]
            merged_rows = merged.num_rows
            del merged
            if cache is not None:
                # A file never merged again gets its ``event_id`` filter now, from the rows in hand,
                # on the spill's disk (in RSS only once a lookup asks for it): built by the first log
                # lookup instead, it cost that lookup a read of the file, and a soak that fell behind
                # looked causes up after every merge (its first lookup, no file filtered, took 28 s;
                # docs/benchmarks.md, "2026-12-03 afternoon"). Files that will be merged again are
                # left to the lookups: their filter would soon go with them.
                for df, rows in written:
                    if final(df):
                        cache.spill_filter(df.file_path, COLUMNS[0], rows.column(COLUMNS[0]))
            new = [df for df, _ in written]
            del written
        rd.add(new)
        rd.remove(files[p] for p in paths)
        removed += len(paths)
        if stats is not None:
            stats.rows_rewritten += merged_rows
            stats.bytes_read += bytes_read
            new_bytes = sum(df.file_size_in_bytes for df in new)
            stats.bytes_rewritten += new_bytes
            stats.bytes_written += new_bytes
            stats.files_added += len(new)
            stats.files_removed += len(paths)
    rd.commit()
    return removed


def _merged_rows(
    table: Any,
    paths: list[str],
    files: dict[str, Any],
    schema: pa.Schema,
    sort_keys: list[tuple[str, str]],
    cache: Any | None,
) -> tuple[pa.Table, int]:
    """The rows of ``paths`` in the log's sort order, and the bytes read from storage for them.

    The rows the flushes kept are taken from ``cache`` and dropped from it at once: the merge
    holds the only reference, so they go with the merged table rather than at the cache's next
    eviction.
    """
    from sinks.rowfiles import kept_rows, read_data_file

    read: list[int] = []

    def rows(path: str) -> pa.Table:
        kept = kept_rows(table, path, cache)
        if kept is None:
            read.append(files[path].file_size_in_bytes)
            kept = read_data_file(table, path)
        return kept.select(schema.names).cast(schema)

    parts = [rows(p) for p in paths]  # merge_runs empties it: the merge holds the only references
    if cache is not None:
        cache.forget(paths)
    return merge_runs(parts, sort_keys), sum(read)
