"""Iceberg table metadata, parsed once per file and built without pyiceberg's defensive deep copies.

A commit reads the current metadata JSON of each table it touches and builds the next version
several times (once per change of a transaction, once more in the catalog's commit). Both were
paid in full on every commit:

* **Parsing.** A metadata file never changes once written (each version is a new file with a
  fresh UUID in its name), so its parsed form can be kept by location. The file a commit writes
  is the one the world's next commit reads, and the writer still holds it in memory: the catalog
  keeps what it wrote as the table's current metadata on that branch (:data:`CACHE`), so in
  steady state no metadata file is parsed at all.
  pyiceberg itself treats the written object as the file's contents (a catalog's
  ``commit_table`` answer becomes the table's metadata).
* **Deep copies.** ``pyiceberg.table.update.update_table_metadata`` ends with
  ``model_copy(deep=True)`` of the whole metadata (schemas, specs, retained snapshots and their
  summaries, the metadata log, the properties with the committed-offset map). pyiceberg's
  metadata models are frozen, and every table update builds new lists and dicts instead of
  changing the base's (checked for pyiceberg 0.12: :func:`build` applies the same updates), so
  the copy protects nothing causeway or pyiceberg does; :func:`build` leaves it out.

* **JSON.** A commit writes each table's new metadata JSON, and almost all of it is what the
  previous version held: the retained snapshots (~16 a table) and the schemas are the same
  objects, handed on by :func:`build`. :func:`metadata_json` serialises each of them once and
  splices the kept JSON into the rest (305-371 → 77-96 µs for a 16-snapshot ``entity_events``
  measured alone, the same bytes).

Objects handed out are shared: nothing may change them in place (pyiceberg's frozen models refuse
attribute assignment; their lists and dicts are only ever replaced).
"""

from __future__ import annotations

import threading
import weakref
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update import (
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.utils.datetime import datetime_to_millis

from sinks.lru import Lru

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.table.metadata import TableMetadata

#: Tables whose current metadata is kept (least recently used evicted): a worker needs 3 per busy
#: world (its three tables on the world's branch), so 1,024 covers ~340 worlds; past that the
#: least recently committed are parsed again, as before the cache.
MAX_TABLES = 1024

Slot = tuple[str, tuple[str, ...]]
"""(branch name, table identifier): one kept metadata per table per branch."""


class MetadataCache:
    """The last metadata read or written per (branch, table), with its file's location; thread-safe.

    One entry per slot, not per file: a commit supersedes the version it read, and only the
    newest version of a table on a branch is read again, so older files' metadata is dropped as
    soon as a newer one is kept (an LRU keyed by file held ~1,000 dead versions on a 3-world
    worker). A read of another version of the slot (a pinned older hash) parses that file and
    keeps it instead.
    """

    def __init__(self, max_tables: int = MAX_TABLES) -> None:
        self.max_tables = max_tables
        self._items: Lru[Slot, tuple[str, TableMetadata]] = Lru(max_tables)
        self._lock = threading.Lock()
        self.parses = 0

    def get(self, slot: Slot, location: str) -> TableMetadata | None:
        with self._lock:
            hit = self._items.recent(slot)
        return None if hit is None or hit[0] != location else hit[1]

    def put(self, slot: Slot, location: str, metadata: TableMetadata) -> None:
        """Keep ``metadata`` as the contents of the (immutable) file at ``location``, for ``slot``."""
        if self.max_tables <= 0:
            return
        with self._lock:
            self._items.keep(slot, (location, metadata))

    def read(self, slot: Slot, io: FileIO, location: str) -> TableMetadata:
        """The metadata file at ``location``, parsed only when it is not the one kept for ``slot``."""
        found = self.get(slot, location)
        if found is not None:
            return found
        metadata = FromInputFile.table_metadata(io.new_input(location))
        with self._lock:
            self.parses += 1
        self.put(slot, location, metadata)
        return metadata

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


CACHE = MetadataCache()


def build(base: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str | None = None) -> TableMetadata:
    """``update_table_metadata(base, updates, metadata_location=...)`` without its final deep copy.

    The same steps as pyiceberg 0.12's (apply each update with one context; on a change, log the
    previous metadata file and stamp ``last_updated_ms``; check spec and sort order against the
    schema). Not for a new table (pyiceberg validates those by a JSON round trip).
    """
    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        if metadata_location:
            new = _update_table_metadata_log(new, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            new = new.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


class BuiltOnceTransaction(Transaction):
    """A pyiceberg transaction that builds its current metadata once per change, not once per read.

    ``Transaction.table_metadata`` re-applies every update and deep-copies the result on each read;
    a flush reads it dozens of times (measured ~60 reads, ~30% of commit CPU). The result depends
    only on the base metadata and the update tuple (both immutable: pyiceberg's metadata models are
    frozen and ``_updates`` is replaced, never mutated), so it is kept until either changes, and
    built by :func:`build` (no deep copy).
    """

    _meta: TableMetadata | None = None
    _meta_base: object = None
    _meta_updates: object = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        if self._meta is None or self._meta_base is not base or self._meta_updates is not updates:
            self._meta = build(base, updates)
            self._meta_base, self._meta_updates = base, updates
        return self._meta


class BuiltOnceTable(Table):
    """A table whose transactions are :class:`BuiltOnceTransaction`."""

    def transaction(self) -> Transaction:
        return BuiltOnceTransaction(self)


#: The metadata list fields whose items :func:`metadata_json` keeps the JSON of: the ones a
#: commit hands on unchanged and that cost most to serialise (a snapshot ~17 µs, a schema 60-120).
_SPLICED = ("snapshots", "schemas")
#: JSON of snapshots and schemas by (object id, ``exclude_none``), each entry with a weak reference
#: to its object: an entry goes when its object does (a snapshot expired from every kept metadata),
#: so the cache holds the JSON of the snapshots and schemas still in use (~20 a table), not the
#: objects. Until 2026-12-03 it held the objects themselves, up to 8,192 before a clear: a 3-world
#: worker kept ~4,000 expired snapshots and their summaries alive at any time.
_FRAGMENTS: dict[tuple[int, bool], tuple[weakref.ref[Any], str]] = {}
#: A bound for safety only (objects that never die): past it the cache starts over.
MAX_FRAGMENTS = 8192
# Re-entrant: an entry's weak-reference callback may run in a thread holding the lock (a collection
# that an allocation under the lock set off).
_FRAGMENTS_LOCK = threading.RLock()


def _forget(key: tuple[int, bool], ref: weakref.ref[Any]) -> None:
    with _FRAGMENTS_LOCK:
        kept = _FRAGMENTS.get(key)
        if kept is not None and kept[0] is ref:
            del _FRAGMENTS[key]


def _fragment(item: Any, exclude_none: bool) -> str:
    key = (id(item), exclude_none)
    kept = _FRAGMENTS.get(key)
    if kept is not None and kept[0]() is item:
        return kept[1]
    text: str = item.model_dump_json(exclude_none=exclude_none)
    ref = weakref.ref(item, lambda r, key=key: _forget(key, r))  # type: ignore[misc]
    with _FRAGMENTS_LOCK:
        if len(_FRAGMENTS) >= MAX_FRAGMENTS:
            _FRAGMENTS.clear()
        _FRAGMENTS[key] = (ref, text)
    return text


def metadata_json(metadata: TableMetadata, exclude_none: bool) -> str:
    """``metadata.model_dump_json(exclude_none=...)``, byte for byte, its snapshots and schemas
    serialised once per object.

    The rest is dumped with those lists empty, and each ``"name":[]`` is replaced by the kept
    items: a top-level list field is the only place the text ``"name":[]`` can occur (a property
    value or a ref name inside it is a JSON string or an object key before ``{``). Format v1
    metadata drops a field of its snapshots when dumped (pyiceberg's serializer): dumped whole.
    """
    if metadata.format_version == 1:
        return metadata.model_dump_json(exclude_none=exclude_none)
    lists = {name: getattr(metadata, name) for name in _SPLICED}
    text = metadata.model_copy(update=dict.fromkeys(_SPLICED, [])).model_dump_json(exclude_none=exclude_none)
    for name, items in lists.items():
        if items:
            joined = ",".join(_fragment(item, exclude_none) for item in items)
            text = text.replace(f'"{name}":[]', f'"{name}":[{joined}]', 1)
    return text
