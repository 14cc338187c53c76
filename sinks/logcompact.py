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
files). Files of at least half the target size (counted in rows at the flush's in-memory row
size, the measure pyiceberg cuts files by) are never compacted again. Everything happens in the
flush's own transaction, published with its Nessie commit; compaction never crosses a partition
(files of an older spec are compacted among themselves and rewritten under the current spec,
which is how an evolved log migrates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

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
    files: list[Candidate], small_below: int, fanout: int = FANOUT, base: int = TIER_BASE_BYTES
) -> list[list[str]]:
    """Groups of files to merge: per (partition, tier), at least ``fanout`` files under ``small_below`` bytes.

    Pure. Emptiest tiers first, so a budget spent in order goes to the smallest files.
    """
    by: dict[tuple[Any, ...], list[Candidate]] = {}
    for f in files:
        if f.size < small_below:
            by.setdefault((f.group, tier(f.size, base)), []).append(f)
    full = [(key, group) for key, group in by.items() if len(group) >= fanout]
    full.sort(key=lambda kg: (kg[0][1], repr(kg[0][0])))
    return [sorted(c.path for c in group) for _, group in full]


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
    (delete index, evaluators, one task per file): the log is append-only and compaction reads
    whole files, so the files are all it needs. Manifest entries come from
    :mod:`sinks.manifest_cache`, so only manifests written since the last flush are decoded.
    """
    from pyiceberg.manifest import ManifestContent

    from sinks import manifest_cache

    snapshot = metadata.current_snapshot()
    if snapshot is None:
        return {}
    out: dict[str, Any] = {}
    for manifest in manifest_cache.manifests(snapshot, io):
        if manifest.content == ManifestContent.DATA:
            for entry in manifest_cache.entries(manifest, io):
                out[entry.data_file.file_path] = entry.data_file
    return out


def compact_log(
    tx: Any,
    target_file_bytes: int,
    stats: Any | None = None,
    fanout: int = FANOUT,
    row_bytes: float | None = None,
    cache: Any | None = None,
) -> int:
    """Merge the log's small files per partition and tier inside ``tx``; returns files removed.

    ``stats`` (a ``FlushStats``) gets the rows and bytes rewritten and read. ``row_bytes`` (the
    in-memory bytes of a row, from the flush's own rows) lets tiers count rows: pyiceberg cuts
    files at in-memory bytes, which on disk come out several times smaller. ``cache`` (the
    committer's ``FileCache``) holds the rows of small files the flushes wrote: those are not read
    back from storage, and the merged ones are dropped from it.
    """
    from sinks.rowdelta import RowDelta, write_data_files
    from sinks.rowfiles import kept_rows, read_data_file
    from sinks.rows import EVENTS_SORT
    from sinks.tables import arrow_schema

    metadata = tx.table_metadata
    if metadata.current_snapshot() is None:
        return 0
    table = tx._table
    files = live_data_files(metadata, table.io)
    if row_bytes:
        # Measured in rows: a file cut at the target size holds target / row_bytes rows, whatever
        # its compressed size on disk, so it counts as done and is never merged again.
        done_rows = int(target_file_bytes / row_bytes / 2)
        rows = [replace(small_file(p, df), size=df.record_count) for p, df in files.items()]
        merges = choose(rows, max(1, done_rows), fanout, base=1)
    else:
        merges = choose([small_file(p, df) for p, df in files.items()], target_file_bytes // 2, fanout)
    if not merges:
        return 0
    rd = RowDelta(tx, {"causeway.compaction": "log"})
    schema = arrow_schema(metadata.schema())
    removed = 0
    for paths in merges:
        kept = {p: kept_rows(table, p, cache) for p in paths}
        parts = [k if k is not None else read_data_file(table, p) for p, k in kept.items()]
        merged = pa.concat_tables([p.select(schema.names).cast(schema) for p in parts])
        merged = merged.sort_by([k for k in EVENTS_SORT if k[0] in schema.names])
        new = [df for chunk in cut(merged, target_file_bytes) for df in write_data_files(metadata, chunk, table.io)]
        rd.add(new)
        rd.remove(files[p] for p in paths)
        if cache is not None:
            cache.forget_rows(paths)
        removed += len(paths)
        if stats is not None:
            stats.rows_rewritten += merged.num_rows
            stats.bytes_read += sum(files[p].file_size_in_bytes for p, k in kept.items() if k is None)
            written = sum(df.file_size_in_bytes for df in new)
            stats.bytes_rewritten += written
            stats.bytes_written += written
            stats.files_added += len(new)
            stats.files_removed += len(paths)
    rd.commit()
    return removed
