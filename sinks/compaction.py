"""Compaction policy of the merge-on-read projections: which data files a flush rewrites, which
delete files it merges or drops, and when old snapshots are expired.

Rewrites are bounded by policy, not by table size (see :mod:`sinks.committer`): a data file is
rewritten once at least ``compact_below`` of its rows are deleted, within ``compact_budget`` x the
rows a flush changes; small files are bin-packed per partition and size tier past
``max_small_files``; delete files are merged tiered past ``max_delete_files``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update.snapshot import ExpireSnapshots

from sinks.flush_stats import FlushStats
from sinks.logcompact import TIER_BASE_BYTES, Candidate, choose, lifts, small_file, within
from sinks.rowdelta import FileCache, TableState, positions
from sinks.rowfiles import kept_rows, read_data_file
from sinks.tables import arrow_schema


@dataclass
class Rewrites:
    """What a flush rewrites: the data files it removes, and their live rows to write again, those
    that go with the flush's own rows (``with_flush``) apart from those that go to their partitions
    (``by_partition``; :meth:`Compaction.picks` says which)."""

    remove: list[str] = field(default_factory=list)
    with_flush: list[pa.Table] = field(default_factory=list)
    by_partition: list[pa.Table] = field(default_factory=list)


@dataclass(frozen=True)
class Compaction:
    """The knobs of the compaction policy (defaults measured in ``bench/sink_flush.py``)."""

    target_file_bytes: int
    snapshot_expire_every: int
    compact_below: float = 0.5
    compact_budget: float = 2.0
    max_delete_files: int = 8
    max_small_files: int = 16
    #: Small files may always be merged up to this many rows per flush, whatever the flush deleted.
    #: At 4,096 a full tier of ~4k-row files (17 x 4k) fit no flush's budget when flushes delete
    #: little (fresh keys), so files stopped growing there and their number grew with the table:
    #: 160 per partition after 12 minutes of a 5,000/s soak, each probed or read by every flush,
    #: and a commit's CPU grew with them (replay: ``python -m bench.small_files_model``, and
    #: docs/architecture.md, "Table layout").
    small_files_min_rows: int = 65_536
    #: Size tiers of small files in rows (as the log's) instead of bytes. Not the default: on
    #: random keys it removes the partitioned table's extra tier but leaves ~1.5x the files after
    #: 1,000 flushes (``python -m bench.small_files_model --tiers rows``; docs/architecture.md,
    #: "Table layout", 2026-12-01 night).
    tiers_in_rows: bool = False

    @property
    def small_file_bytes(self) -> int:
        """Files under this size are small: bin-packed per partition and tier, their rows kept by their writer."""
        return self.target_file_bytes // 4

    def pick(self, state: TableState, new_deletes: dict[str, list[int]]) -> list[tuple[str, set[int]]]:
        """The data files a flush rewrites, each with its deleted positions (both of
        :meth:`picks`'s lists). Pure."""
        with_flush, by_partition = self.picks(state, new_deletes)
        return with_flush + by_partition

    def picks(
        self, state: TableState, new_deletes: dict[str, list[int]]
    ) -> tuple[list[tuple[str, set[int]]], list[tuple[str, set[int]]]]:
        """The data files a flush rewrites, each with its deleted positions, in two lists: those
        whose live rows may be written with the flush's own rows, and those whose rows go to their
        partitions. Pure.

        With the flush: the unpartitioned files (a small flush's one file, ``writes_one_file``)
        rewritten because this flush left them sparse, when their live rows together fit the
        budget below. Their rows were written with a flush and are rewritten because the file
        emptied, not to be moved; into the type partitions they came out as a small file per type
        (and at 1,000 keys and ~150 updates a flush, one such file empties in most flushes). A
        sparse file over the budget (taken alone, below) and a small-file merge's files go to
        their partitions: rows that stayed unpartitioned would be rewritten once more when their
        tier merges (a replay of the policy at 10k keys: 1.1x the rows rewritten).

        Candidates are files this flush deletes from whose live fraction falls below
        ``compact_below``, emptiest first; then, in a partition whose size tier holds more than
        ``max_small_files`` files under :attr:`small_file_bytes`, those files (each flush adds one
        per partition it touches; see ``sinks.logcompact``).
        A flush rewrites at most ``compact_budget`` × the rows it deletes — but always at least one
        sparse file, so the bound is also "one file", which ``target_file_bytes`` caps — plus, for
        small files, at least ``small_files_min_rows``. Without the budget, files written together
        would cross the threshold together and one flush would rewrite most of the table.
        """
        candidates: list[tuple[float, str, set[int]]] = []
        for path, fresh_list in new_deletes.items():
            live = state.files.get(path)
            if live is None or live.data_file.record_count <= 0:
                continue
            dead = set(fresh_list) | set(live.deleted.to_pylist())
            fraction = (live.data_file.record_count - len(dead)) / live.data_file.record_count
            if fraction < self.compact_below:
                candidates.append((fraction, path, dead))
        candidates.sort()
        budget = self.compact_budget * max(1, sum(len(v) for v in new_deletes.values()))
        chosen: list[tuple[str, set[int]]] = []
        rows = 0
        for _, path, dead_set in candidates:
            live_rows = state.files[path].data_file.record_count - len(dead_set)
            if chosen and rows + live_rows > budget:
                break
            chosen.append((path, dead_set))
            rows += live_rows
        unpartitioned = [(p, dead) for p, dead in chosen if not len(state.files[p].data_file.partition or ())]
        carried = sum(state.files[p].data_file.record_count - len(dead) for p, dead in unpartitioned)
        with_flush = unpartitioned if carried <= budget else []
        taken = {p for p, _ in chosen}
        going_with_flush = {p for p, _ in with_flush}
        chosen = [c for c in chosen if c[0] not in going_with_flush]
        # Small files (one per flush and partition) are bin-packed per partition and size tier, once
        # a tier holds more than max_small_files of them, under the same budget but never less than
        # small_files_min_rows: a flush that deletes little (new keys, one hot key updated) would
        # otherwise merge nothing, and a world of small flushes would grow a file per partition per
        # flush, which every scan and time-travel read then plans (500 flushes: 3,296 files).
        budget = max(budget, self.small_files_min_rows)
        base = 1 if self.tiers_in_rows else TIER_BASE_BYTES
        measure = {
            p: live.data_file.record_count if self.tiers_in_rows else live.data_file.file_size_in_bytes
            for p, live in state.files.items()
        }
        small = [
            replace(small_file(p, live.data_file), size=measure[p])
            for p, live in state.files.items()
            if p not in taken and live.data_file.file_size_in_bytes < self.small_file_bytes
        ]
        for group in choose(small, 2**62, self.max_small_files + 1, base=base):
            dead_of = {p: set(new_deletes.get(p, ())) | set(state.files[p].deleted.to_pylist()) for p in group}
            in_rows = [Candidate(p, (), state.files[p].data_file.record_count - len(dead_of[p])) for p in group]
            part = within(in_rows, budget - rows)
            # What is left of the budget may cover only the start of a group (often one file).
            # Merged, those files would land in the tier they came from and be merged again at the
            # next flush whose budget ends inside the tier (bench.small_files_model: 4.6 rows
            # rewritten per row written over 300 flushes, 0.96 without). Wait for a budget that
            # lifts them.
            if len(part) < len(group) and not lifts([measure[c.path] for c in part], base):
                continue
            chosen.extend((c.path, dead_of[c.path]) for c in part)
            rows += sum(c.size for c in part)
        return with_flush, chosen

    def rewrites(
        self,
        table: Table,
        state: TableState,
        new_deletes: dict[str, list[int]],
        stats: FlushStats,
        cache: FileCache | None = None,
    ) -> Rewrites:
        """Rewrite the files :meth:`picks` chooses: their paths and their live rows, those to be
        written with the flush's rows apart from those that go to their partitions.

        A file whose rows its writer kept in ``cache`` (small files, see ``FileCache.seed_rows``)
        is not read back.
        """
        out = Rewrites()
        schema = arrow_schema(table.schema())
        with_flush, by_partition = self.picks(state, new_deletes)
        for carried, picked in ((out.with_flush, with_flush), (out.by_partition, by_partition)):
            for path, dead_set in picked:
                live = state.files[path]
                kept = kept_rows(table, path, cache)
                t = read_data_file(table, path) if kept is None else kept
                stats.bytes_read += 0 if kept is not None else live.data_file.file_size_in_bytes
                if dead_set:
                    dead = pa.array(sorted(dead_set), pa.int64())
                    t = t.filter(pc.invert(pc.is_in(positions(t.num_rows), value_set=dead)))
                out.remove.append(path)
                if t.num_rows:
                    carried.append(t.select(schema.names).cast(schema))
                    stats.rows_rewritten += t.num_rows
        return out

    def expire(self, tx: Transaction) -> None:
        metadata = tx.table_metadata
        if len(metadata.snapshots) <= self.snapshot_expire_every:
            return
        protected = {ref.snapshot_id for ref in metadata.refs.values()}
        old = [s.snapshot_id for s in metadata.snapshots if s.snapshot_id not in protected]
        if old:
            ExpireSnapshots(tx).by_ids(old).commit()
