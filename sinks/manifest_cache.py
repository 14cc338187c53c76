"""Parsed manifest entries kept between flushes: every Iceberg manifest file is immutable.

Every flush plans each table (``DataScan.plan_files`` for the projections' key lookup and the
log's compaction) and rewrites manifests it removes files from (``RowDelta``); pyiceberg reads and
decodes every manifest of the snapshot from Avro each time (``ManifestFile.fetch_manifest_entry``,
measured 58 ms of thread CPU per 1,000-event commit in ~30 reads, the largest single item of the
planning), although only the one to three manifests the previous flush wrote are new. A manifest's
path never gets other contents (pyiceberg names each one with a fresh UUID), so its parsed entries
can be kept and handed out again.

What a read returns also depends on the manifest-list entry it came through: entries inherit
their snapshot id, sequence numbers and spec id from it. The cache key therefore holds those
fields, and a manifest whose sequence number is not assigned yet (one being written in the same
commit) is never cached. Entries are shared between callers: pyiceberg and causeway only read
them (a manifest writer copies an entry it re-writes), never change them after the read.

:func:`entries` is what causeway's own planners call (the key lookup, the manifest rewrite of a
row delta, the log's compaction). pyiceberg's own code paths (its scans, `upsert`, `delete`, used by
reconciliation, schema sync and the benchmark's naive contender) keep reading manifests themselves:
the cache once replaced ``ManifestFile.fetch_manifest_entry`` process-wide, and a pyiceberg
`upsert` in the naive contender then failed its own "required files to delete" validation (cause
not found), so the cache's reach is the code its tests compare against pyiceberg's planning.
The bound is :data:`MAX_ENTRIES` entries (least recently used manifests evicted first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from pyiceberg.io import FileIO
from pyiceberg.manifest import UNASSIGNED_SEQ, ManifestEntry, ManifestFile

#: Manifest entries kept (one per data or delete file per manifest): 3-6 KiB each as measured
#: (tracemalloc over the small benchmark's manifests), so at most ~30-60 MiB. A worker whose worlds hold
#: more live files than this decodes the least recently planned ones again, as before the cache.
MAX_ENTRIES = 10_000

_Key = tuple[str, bool, int, int | None, int]


class ManifestEntryCache:
    """A bounded LRU of parsed manifest entries, keyed by manifest path and inherited fields."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[_Key, tuple[ManifestEntry, ...]] = OrderedDict()
        self._entries = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(manifest: ManifestFile, discard_deleted: bool) -> _Key | None:
        seq = manifest.sequence_number
        if seq is None or seq == UNASSIGNED_SEQ:
            return None  # written in this commit: its entries will inherit another number
        return (manifest.manifest_path, discard_deleted, seq, manifest.added_snapshot_id, manifest.partition_spec_id)

    def get(self, key: _Key) -> list[ManifestEntry] | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return list(hit)

    def put(self, key: _Key, entries: list[ManifestEntry]) -> None:
        if len(entries) > self.max_entries:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = tuple(entries)
            self._entries += len(entries)
            while self._entries > self.max_entries:
                _, old = self._items.popitem(last=False)
                self._entries -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._entries = 0


CACHE = ManifestEntryCache()


def entries(manifest: ManifestFile, io: FileIO, discard_deleted: bool = True) -> list[ManifestEntry]:
    """``manifest.fetch_manifest_entry(io, discard_deleted)``, served from :data:`CACHE`."""
    key = CACHE.key(manifest, discard_deleted)
    if key is not None:
        found = CACHE.get(key)
        if found is not None:
            return found
    read = manifest.fetch_manifest_entry(io, discard_deleted)
    if key is not None:
        CACHE.put(key, read)
    return read
