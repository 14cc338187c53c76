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
from collections.abc import Callable
from enum import Enum
from typing import Any

from pyiceberg.avro.file import _SCHEMA_KEY, AvroFile
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import resolve_reader
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    PartitionFieldSummary,
    _inherit_from_manifest,
)
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Snapshot

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
    read = _fetch_entries(manifest, io, discard_deleted)
    if key is not None:
        CACHE.put(key, read)
    return read


class _ResolvedAvroFile(AvroFile[Any]):
    """pyiceberg's ``AvroFile`` whose reader tree is built once per (file schema, read schema).

    Opening an Avro file converts its header's schema to an Iceberg schema and resolves a reader
    tree against the read schema, in Python; for a manifest of a few entries that was ~85 % of
    the read (profile of ``bench.commit_cpu --events 200``: 235 opens, 2.3 of 2.7 s). Every
    manifest of a (spec, schema) carries the same header schema, and a reader tree holds no state
    between records, so the tree is kept by the header's schema text.
    """

    __slots__ = ()
    _resolved: dict[tuple[str, int], tuple[Schema, Reader]] = {}
    _lock = threading.Lock()
    MAX_SCHEMAS = 256

    def __enter__(self) -> _ResolvedAvroFile:
        from pyiceberg.avro.decoder import new_decoder

        with self.input_file.open() as f:
            self.decoder = new_decoder(f.read())
        self.header = self._read_header()
        key = (self.header.meta.get(_SCHEMA_KEY, ""), id(self.read_schema))
        with self._lock:
            found = self._resolved.get(key)
        if found is None:
            schema = self.header.get_schema()
            found = (schema, resolve_reader(schema, self.read_schema or schema, self.read_types, self.read_enums))
            with self._lock:
                if len(self._resolved) >= self.MAX_SCHEMAS:
                    self._resolved.clear()
                self._resolved[key] = found
        self.schema, self.reader = found
        if not self.read_schema:
            self.read_schema = self.schema
        return self


#: How a manifest and a manifest list are read (pyiceberg 0.12's ``fetch_manifest_entry`` and
#: ``read_manifest_list``); module constants, so the reader key's ``id(read_schema)`` is stable.
_ENTRY_SCHEMA = MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION]
_ENTRY_TYPES: dict[int, Callable[..., Any]] = {-1: ManifestEntry, 2: DataFile}
_ENTRY_ENUMS: dict[int, Callable[..., Enum]] = {0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}
_LIST_SCHEMA = MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION]
_LIST_TYPES: dict[int, Callable[..., Any]] = {-1: ManifestFile, 508: PartitionFieldSummary}
_LIST_ENUMS: dict[int, Callable[..., Enum]] = {517: ManifestContent}


def _fetch_entries(manifest: ManifestFile, io: FileIO, discard_deleted: bool) -> list[ManifestEntry]:
    """``manifest.fetch_manifest_entry(io, discard_deleted)``, through the kept reader trees."""
    with _ResolvedAvroFile(io.new_input(manifest.manifest_path), _ENTRY_SCHEMA, _ENTRY_TYPES, _ENTRY_ENUMS) as reader:
        return [
            _inherit_from_manifest(entry, manifest)
            for entry in reader
            if not discard_deleted or entry.status != ManifestEntryStatus.DELETED
        ]


def remember(manifest: ManifestFile, written: list[ManifestEntry]) -> None:
    """Keep the entries of a manifest this process just wrote, as a read through ``manifest`` (its
    manifest-list entry, sequence number assigned) would return them, so the next flush does not
    read back what it wrote.

    ``written`` are the entries as the writer encoded them: added ones carry no sequence number
    (a read inherits the manifest's), and a written ``DataFile`` has no spec id (a read sets the
    manifest's). Fresh entries are built; the written ones stay untouched.
    """
    key = CACHE.key(manifest, True)
    if key is None:
        return
    kept = []
    for e in written:
        if e.status == ManifestEntryStatus.DELETED:
            continue
        entry = ManifestEntry.from_args(
            status=e.status,
            snapshot_id=e.snapshot_id,
            sequence_number=e.sequence_number,
            file_sequence_number=e.file_sequence_number,
            data_file=e.data_file,
        )
        kept.append(_inherit_from_manifest(entry, manifest))
    CACHE.put(key, kept)


class _ListCache:
    """Manifest lists by path (immutable, like manifests), bounded (LRU); thread-safe."""

    def __init__(self, max_lists: int = 1024) -> None:
        self.max_lists = max_lists
        self._items: OrderedDict[str, tuple[ManifestFile, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0

    def manifests(self, snapshot: Snapshot, io: FileIO) -> list[ManifestFile]:
        path = snapshot.manifest_list
        with self._lock:
            hit = self._items.get(path)
            if hit is not None:
                self._items.move_to_end(path)
                return list(hit)
        with _ResolvedAvroFile(io.new_input(path), _LIST_SCHEMA, _LIST_TYPES, _LIST_ENUMS) as reader:
            read = tuple(reader)
        with self._lock:
            self.reads += 1
            self._items[path] = read
            while len(self._items) > self.max_lists:
                self._items.popitem(last=False)
        return list(read)

    def put(self, path: str, manifests: list[ManifestFile]) -> None:
        with self._lock:
            self._items[path] = tuple(manifests)
            while len(self._items) > self.max_lists:
                self._items.popitem(last=False)


LISTS = _ListCache()


def remember_list(snapshot: Snapshot, listed: list[ManifestFile]) -> None:
    """Keep the manifest list this process just wrote for ``snapshot``: ``listed`` as the list
    holds them (sequence numbers assigned by the list writer)."""
    LISTS.put(snapshot.manifest_list, listed)


def manifests(snapshot: Snapshot, io: FileIO) -> list[ManifestFile]:
    """``snapshot.manifests(io)`` for causeway's planners, each manifest list read once.

    Callers only read the returned manifests (a manifest list writer copies what it writes).
    """
    return LISTS.manifests(snapshot, io)
