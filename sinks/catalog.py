"""A pyiceberg catalog whose table pointers live in Project Nessie, with multi-table atomic commits.

Table data and metadata files are written by pyiceberg to the warehouse (``file://`` by default,
``s3://`` through pyiceberg's FileIO properties); Nessie holds, per branch, the key
``namespace.table`` → metadata location. Nessie's own Iceberg REST endpoint refuses ``file://``
warehouses, so pointers are committed through the REST v2 API (``sinks.nessie``).

The catalog works on one reference:

* ``"main"`` – a branch; reads see its head, writes commit to it;
* ``"main@<hash>"`` – a branch pinned at a commit, read-only;
* ``"main@*<epoch-ms>"`` / :meth:`NessieCatalog.as_of` – the branch as of a time, read-only
  (the server resolves ``@*`` to the last commit at or before that time; verified on Nessie 0.99);
* a tag name – read-only.

**Staging.** pyiceberg has no multi-table transaction. Between :meth:`NessieCatalog.begin` and
:meth:`NessieCatalog.publish` the catalog pins the branch head it read, every ``load_table`` reads
at that hash (so every decision is taken against one consistent state), and ``commit_table``
writes the next metadata file but only *records* the new pointer. :meth:`publish` sends all
recorded pointers as **one** Nessie commit with that hash as the expected hash: the server accepts
it only if none of the touched keys changed since (it rebases over unrelated commits), so either
every table moves or none does. After a failed publish the staged pointers are dropped; call
``begin()`` again to reload at the new head. Metadata files of a failed attempt are orphans that
Nessie GC (or an orphan-file sweep) removes; they are never referenced.

Outside staging, ``commit_table`` publishes one table per Nessie commit (pyiceberg's own retry on
``CommitFailedException`` then applies), which is what ad-hoc tools and tests expect.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog import MetastoreCatalog, PropertiesUpdateSummary
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io import FileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties

from sinks import table_metadata
from sinks.errors import CommitStateUnknown, NessieConflict, NessieNotFound, unreadable_if_missing
from sinks.fileio import file_io, write_file
from sinks.nessie import IcebergTable, Namespace, Operation, SyncNessieClient

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table.metadata import TableMetadata

    from streams.settings import Settings

ICEBERG_TABLE = "ICEBERG_TABLE"
NAMESPACE = "NAMESPACE"

_REF = re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9./_-]*?)(?:@(?P<hash>[0-9a-fA-F]{8,64}))?(?:\*(?P<ts>[^@*]+))?")


class ReadOnlyReference(CommitFailedException):
    """A write was attempted through a catalog opened on a tag, a hash or a timestamp."""


class NotStaging(RuntimeError):
    """``publish`` was called without ``begin``."""


@dataclass(frozen=True)
class RefSpec:
    """A parsed reference: a name, optionally pinned at a hash or a timestamp (epoch ms)."""

    name: str
    hash: str | None = None
    timestamp_ms: int | None = None

    @classmethod
    def parse(cls, ref: str) -> RefSpec:
        """Parse ``name``, ``name@hash``, ``name@*<ms|ISO-8601>`` or ``name*<ms|ISO-8601>``."""
        m = _REF.fullmatch(ref.replace("@*", "*") if "@*" in ref else ref)
        if m is None or (".." in ref):
            raise ValueError(f"not a Nessie reference: {ref!r}")
        ts = m.group("ts")
        return cls(m.group("name"), m.group("hash"), _to_ms(ts) if ts else None)

    @property
    def pinned(self) -> bool:
        return self.hash is not None or self.timestamp_ms is not None

    def __str__(self) -> str:
        """The form Nessie's REST v2 API accepts in a path."""
        if self.hash:
            return f"{self.name}@{self.hash}"
        if self.timestamp_ms is not None:
            return f"{self.name}@*{self.timestamp_ms}"
        return self.name


def _to_ms(value: str | int | datetime) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, int) or value.isdigit():
        return int(value)
    return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


@dataclass
class _Staged:
    """One table's pending pointer: what goes into the Nessie PUT operation."""

    key: Identifier
    content_id: str | None  # None for a table created in this session
    metadata: TableMetadata
    metadata_location: str


@dataclass(frozen=True)
class Published:
    """The outcome of a publish: the new branch head and the tables it moved."""

    hash: str
    keys: tuple[Identifier, ...]


@functools.cache
def _legacy_snapshot_id() -> bool:
    """pyiceberg's ``legacy-current-snapshot-id`` setting (write ``-1``, not nothing, for no snapshot)."""
    from pyiceberg.utils.config import Config

    return bool(Config().get_bool("legacy-current-snapshot-id"))


def put_table(key: Identifier, metadata: TableMetadata, metadata_location: str, content_id: str | None) -> Operation:
    """The Nessie PUT of a table pointer (an update must carry the current content id)."""
    return Operation.put_table(
        tuple(key),
        metadata_location,
        snapshot_id=metadata.current_snapshot_id if metadata.current_snapshot_id is not None else -1,
        schema_id=metadata.current_schema_id,
        spec_id=metadata.default_spec_id,
        sort_order_id=metadata.default_sort_order_id,
        content_id=content_id,
    )


class NessieCatalog(MetastoreCatalog):
    """pyiceberg catalog on one Nessie reference; see the module docstring for staging and publish."""

    def __init__(
        self,
        name: str = "nessie",
        *,
        client: SyncNessieClient,
        ref: str = "main",
        warehouse: str,
        author: str = "causeway",
        **properties: str,
    ) -> None:
        super().__init__(name, warehouse=warehouse, **properties)
        self.client = client
        self.spec = RefSpec.parse(ref)
        self.warehouse = warehouse.rstrip("/")
        self.author = author
        self._is_tag: bool | None = None
        self._base_hash: str | None = None  # pinned head while staging
        self._staged: dict[Identifier, _Staged] = {}
        self._staged_namespaces: set[Identifier] = set()
        # While staging the read ref is a fixed hash, so what it holds cannot change: contents
        # (None: absent) are read once per staging session. Parsed metadata files are kept per
        # process (sinks.table_metadata.CACHE): a metadata file never changes.
        self._pinned_contents: dict[Identifier, Any | None] = {}
        #: Tables whose contents ``begin`` reads with the head (``reading``).
        self._begin_reads: tuple[Identifier, ...] = ()

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Settings, ref: str, client: SyncNessieClient | None = None) -> NessieCatalog:
        """A catalog on ``ref`` configured from Settings (warehouse, S3 credentials, author)."""
        props: dict[str, str] = {}
        if settings.warehouse.startswith("s3://"):
            props.update(
                {
                    "s3.endpoint": settings.s3_endpoint,
                    "s3.access-key-id": settings.s3_access_key.reveal(),
                    "s3.secret-access-key": settings.s3_secret_key.reveal(),
                    "s3.region": settings.s3_region,
                }
            )
            props = {k: v for k, v in props.items() if v}
        warehouse = settings.warehouse
        if warehouse.startswith("/"):
            warehouse = "file://" + warehouse
        elif warehouse.startswith("file://./"):
            import os

            warehouse = "file://" + os.path.abspath(warehouse[len("file://") :])
        if client is None:
            client = SyncNessieClient.from_settings(settings)
        return cls(client=client, ref=ref, warehouse=warehouse, author=settings.commit_author, **props)

    def at(self, ref: str) -> NessieCatalog:
        """The same warehouse and client on another reference (``main@hash``, a tag, ...)."""
        props = {k: v for k, v in self.properties.items() if k != "warehouse"}
        return NessieCatalog(
            self.name, client=self.client, ref=ref, warehouse=self.warehouse, author=self.author, **props
        )

    def as_of(self, when: datetime | int | str) -> NessieCatalog:
        """A read-only catalog on this branch as it was at ``when`` (datetime, epoch ms or ISO-8601).

        The time is resolved once to the last commit at or before it, so every table read through
        the returned catalog sees the same commit.
        """
        return self.at(f"{self.spec.name}@{self.resolve_timestamp(_to_ms(when))}")

    def resolve_timestamp(self, timestamp_ms: int) -> str:
        """The hash of the last commit on this branch at or before ``timestamp_ms``.

        Uses Nessie's ``name@*<epoch-ms>`` relative reference (the ISO form without fractional
        seconds is refused by Nessie 0.99, so milliseconds are sent).
        """
        for page in self.client.history(f"{self.spec.name}@*{timestamp_ms}", max_records=1):
            for entry in page:
                return entry.hash
            break
        raise NessieNotFound(f"no commit on {self.spec.name} at or before {timestamp_ms} ms")

    # --- reference state -------------------------------------------------------------------------

    @property
    def branch(self) -> str:
        return self.spec.name

    @property
    def read_only(self) -> bool:
        if self.spec.pinned:
            return True
        if self._is_tag is None:
            self._is_tag = self.client.get_reference(self.spec.name).type.upper() == "TAG"
        return self._is_tag

    @property
    def read_ref(self) -> str:
        """The reference string every read uses: the pinned head while staging."""
        if self._base_hash is not None:
            return f"{self.spec.name}@{self._base_hash}"
        return str(self.spec)

    @property
    def staging(self) -> bool:
        return self._base_hash is not None

    @property
    def base_hash(self) -> str | None:
        """The head read by ``begin``; the expected hash of the next publish."""
        return self._base_hash

    def head(self) -> str:
        """The current hash of the reference (resolved on the server for pinned references)."""
        if self.spec.hash:
            return self.spec.hash
        if self.spec.timestamp_ms is not None:
            return self.resolve_timestamp(self.spec.timestamp_ms)
        return self.client.get_reference(self.spec.name).hash

    def _require_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyReference(f"reference {self.spec} is read-only (a tag, a hash or a timestamp)")

    # --- staging ---------------------------------------------------------------------------------

    def reading(self, identifiers: Sequence[str | Identifier]) -> NessieCatalog:
        """Have ``begin`` read these tables' contents together with the head: one round trip (the
        contents call answers with the commit it read) instead of a reference read and a contents
        read. A commit waits for each round trip, at Nessie's latency under load (43-69 ms each
        in the small benchmark's latency phase, docs/benchmarks.md). Returns ``self``."""
        self._begin_reads = tuple(self._identifier(i) for i in identifiers)
        return self

    def begin(self, at_hash: str | None = None) -> str:
        """Start staging: pin the branch head (or ``at_hash``) for reads, record writes. Returns it."""
        if self.spec.pinned:
            self._require_writable()
        self.discard()
        if at_hash is None and self._begin_reads:
            found, ref = self.client.get_contents_and_reference(self.spec.name, [tuple(k) for k in self._begin_reads])
            self._is_tag = ref.type.upper() == "TAG"
            self._require_writable()
            self._base_hash = ref.hash
            for key in self._begin_reads:
                self._pinned_contents[key] = found.get(tuple(key))
            return ref.hash
        if at_hash is None or self._is_tag is None:
            # One round trip tells both: the head, and whether the name is a (read-only) tag.
            ref = self.client.get_reference(self.spec.name)
            self._is_tag = ref.type.upper() == "TAG"
            self._require_writable()
            at_hash = at_hash or ref.hash
        self._base_hash = at_hash
        return self._base_hash

    def discard(self) -> None:
        """Drop staged pointers and leave staging mode (their metadata files become orphans)."""
        self._staged.clear()
        self._staged_namespaces.clear()
        self._pinned_contents.clear()
        self._base_hash = None

    @property
    def staged_tables(self) -> tuple[Identifier, ...]:
        return tuple(self._staged)

    def staged_operations(self) -> list[Operation]:
        """The Nessie operations that ``publish`` would send."""
        ops = [Operation.put_namespace(ns) for ns in sorted(self._staged_namespaces)]
        ops += [put_table(st.key, st.metadata, st.metadata_location, st.content_id) for st in self._staged.values()]
        return ops

    def publish(self, message: str, properties: dict[str, str] | None = None, author: str | None = None) -> Published:
        """Commit every staged pointer as one Nessie commit expecting the hash ``begin`` read.

        Raises NessieConflict when a touched table changed since (nothing changed on the branch),
        CommitStateUnknown when the outcome is unknown (check history before retrying). Either way
        staging ends; call ``begin`` to reload. With nothing staged, returns the base hash.
        """
        if self._base_hash is None:
            raise NotStaging("publish() needs begin() first")
        base, keys = self._base_hash, tuple(self._staged)
        if not self._staged and not self._staged_namespaces:
            self.discard()
            return Published(base, ())
        ops = self.staged_operations()
        try:
            result = self.client.commit(
                self.spec.name,
                base,
                ops,
                message=message,
                author=author or self.author,
                properties=dict(properties or {}),
            )
        finally:
            self.discard()
        return Published(result.hash, keys)

    @contextmanager
    def transaction(self, message: str, properties: dict[str, str] | None = None) -> Iterator[NessieCatalog]:
        """``with catalog.transaction("msg") as cat: ...`` stages, then publishes on a clean exit."""
        self.begin()
        try:
            yield self
        except BaseException:
            self.discard()
            raise
        self.publish(message, properties)

    # --- contents --------------------------------------------------------------------------------

    def prefetch(self, identifiers: Sequence[str | Identifier]) -> None:
        """Read the contents of ``identifiers`` at the pinned head in one Nessie call (staging only).

        Later loads and commits of those tables in this staging session use the answer instead of
        one contents call each. Outside staging the ref can move, so nothing is kept.
        """
        if not self.staging:
            return
        keys = [k for k in (self._identifier(i) for i in identifiers) if k not in self._pinned_contents]
        if not keys:
            return
        try:
            found = self.client.get_contents(self.read_ref, [tuple(k) for k in keys])
        except NessieNotFound:
            found = {}
        for k in keys:
            self._pinned_contents[k] = found.get(tuple(k))

    def _content(self, key: Identifier) -> Any | None:
        if self.staging and key in self._pinned_contents:
            return self._pinned_contents[key]
        try:
            found = self.client.get_contents(self.read_ref, [tuple(key)])
        except NessieNotFound:
            found = {}
        content = found.get(tuple(key))
        if self.staging:
            self._pinned_contents[key] = content
        return content

    def _metadata_at(self, key: Identifier) -> tuple[TableMetadata, str, str | None]:
        staged = self._staged.get(key)
        if staged is not None:
            return staged.metadata, staged.metadata_location, staged.content_id
        content = self._content(key)
        if not isinstance(content, IcebergTable):
            raise NoSuchTableError(f"table does not exist on {self.read_ref}: {'.'.join(key)}")
        location = content.metadata_location
        # The branch may point at a file that is gone (deleted, warehouse directory removed): not an
        # outage, no retry brings it back.
        with unreadable_if_missing(f"table {'.'.join(key)} on {self.read_ref}: metadata", path=location):
            metadata = table_metadata.CACHE.read(  # metadata files are immutable
                (self.spec.name, key), file_io(self.properties, location), location
            )
        return metadata, location, content.id

    def _load_file_io(self, properties: Properties = EMPTY_DICT, location: str | None = None) -> FileIO:
        # pyiceberg's builds a FileIO (and, on first use, its filesystem) per table load and commit.
        return file_io({**self.properties, **properties}, location)

    def _identifier(self, identifier: str | Identifier) -> Identifier:
        ident = self.identifier_to_tuple(identifier)
        if len(ident) < 2:
            raise NoSuchTableError(f"a table identifier needs a namespace: {identifier}")
        return ident

    # --- pyiceberg Catalog API -------------------------------------------------------------------

    def load_table(self, identifier: str | Identifier) -> Table:
        key = self._identifier(identifier)
        metadata, location, _ = self._metadata_at(key)
        io = self._load_file_io(metadata.properties, location)
        return table_metadata.BuiltOnceTable(key, metadata=metadata, metadata_location=location, io=io, catalog=self)

    def create_table(
        self,
        identifier: str | Identifier,
        schema: Schema | pa.Schema,
        location: str | None = None,
        partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
        sort_order: SortOrder = UNSORTED_SORT_ORDER,
        properties: Properties = EMPTY_DICT,
    ) -> Table:
        self._require_writable()
        key = self._identifier(identifier)
        if key in self._staged or self._content(key) is not None:
            raise TableAlreadyExistsError(f"table already exists: {'.'.join(key)}")
        namespace = key[:-1]
        if namespace not in self._staged_namespaces and not self.namespace_exists(namespace):
            if self.staging:
                self._staged_namespaces.add(namespace)
            else:
                raise NoSuchNamespaceError(f"namespace does not exist: {'.'.join(namespace)}")
        staged = self._create_staged_table(key, schema, location, partition_spec, sort_order, properties)
        self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        self._put(key, None, staged.metadata, staged.metadata_location, f"create table {'.'.join(key)}")
        return self.load_table(key)

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        """pyiceberg's ``ToOutputFile.table_metadata``, its configuration read once per process:
        it read ``~/.pyiceberg.yaml`` and the environment for every file written (~0.5 ms a table,
        three tables a commit).

        Opened without pyiceberg's existence check (a stat) and parent ``create_dir``: the name
        carries a fresh UUID, and that check could not stop a concurrent writer anyway."""
        from pyiceberg.serializers import Compressor

        data = table_metadata.metadata_json(metadata, exclude_none=not _legacy_snapshot_id()).encode()
        data = Compressor.get_compressor(metadata_path).bytes_compressor()(data)
        write_file(io, metadata_path, data)  # one open, one write: no stream buffer for ~20 KB

    def _resolve_table_location(self, location: str | None, database_name: str, table_name: str) -> str:
        # A unique suffix keeps two tables of the same name (on two branches, or dropped and
        # re-created) from sharing a directory, like Nessie's own Iceberg catalog does.
        if location:
            return location.rstrip("/")
        return f"{self.warehouse}/{database_name}/{table_name}_{uuid.uuid4().hex}"

    @staticmethod
    def identifier_to_database_and_table(
        identifier: str | Identifier,
        err: type[ValueError] | type[NoSuchTableError] | type[NoSuchNamespaceError] = ValueError,
    ) -> tuple[str, str]:
        """Nessie namespaces may be nested: ``("a", "b", "t")`` → ``("a.b", "t")``."""
        ident = MetastoreCatalog.identifier_to_tuple(identifier)
        if len(ident) < 2:
            raise err(f"a table identifier needs a namespace: {identifier}")
        return ".".join(ident[:-1]), ident[-1]

    def _create_staged_table(self, identifier: str | Identifier, *args: Any, **kwargs: Any) -> Any:
        staged = super()._create_staged_table(identifier, *args, **kwargs)
        staged._identifier = self._identifier(identifier)
        return staged

    def register_table(self, identifier: str | Identifier, metadata_location: str, overwrite: bool = False) -> Table:
        self._require_writable()
        key = self._identifier(identifier)
        current = self._content(key)
        if current is not None and not overwrite:
            raise TableAlreadyExistsError(f"table already exists: {'.'.join(key)}")
        metadata = table_metadata.CACHE.read(
            (self.spec.name, key), file_io(self.properties, metadata_location), metadata_location
        )
        content_id = current.id if current is not None else None
        self._put(key, content_id, metadata, metadata_location, f"register table {'.'.join(key)}")
        return self.load_table(key)

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        """Stage (while staging) or publish the next metadata version of one table."""
        self._require_writable()
        key = self._identifier(table.name())
        try:
            metadata, location, content_id = self._metadata_at(key)
            current: Table | None = Table(
                key, metadata, location, self._load_file_io(metadata.properties, location), self
            )
        except NoSuchTableError:
            current, content_id = None, None
        if current is not None and not self.staging and current.metadata_location != table.metadata_location:
            raise CommitFailedException(f"table {'.'.join(key)} changed since it was loaded")
        staged = self._update_and_stage_table(current, key, requirements, updates)
        # A change stamps last_updated_ms, so a different stamp means a change: only an equal one
        # needs the full comparison of the two metadata trees.
        if (
            current is not None
            and staged.metadata.last_updated_ms == current.metadata.last_updated_ms
            and staged.metadata == current.metadata
        ):
            return CommitTableResponse(metadata=current.metadata, metadata_location=current.metadata_location)  # type: ignore[call-arg]
        self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        self._put(key, content_id, staged.metadata, staged.metadata_location, f"update table {'.'.join(key)}")
        return CommitTableResponse(metadata=staged.metadata, metadata_location=staged.metadata_location)  # type: ignore[call-arg]

    def _update_and_stage_table(
        self,
        current_table: Table | None,
        table_identifier: Identifier,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> StagedTable:
        """pyiceberg's, but the next metadata is built without a deep copy (``table_metadata.build``)."""
        if current_table is None:  # a new table: pyiceberg validates it by a JSON round trip
            return super()._update_and_stage_table(current_table, table_identifier, requirements, updates)
        for requirement in requirements:
            requirement.validate(current_table.metadata)
        metadata = table_metadata.build(current_table.metadata, updates, current_table.metadata_location)
        version = self._parse_metadata_version(current_table.metadata_location) + 1
        location = load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(
            version
        )
        return StagedTable(
            identifier=table_identifier,
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(properties=metadata.properties, location=location),
            catalog=self,
        )

    def _put(
        self, key: Identifier, content_id: str | None, metadata: TableMetadata, location: str, message: str
    ) -> None:
        # What was written is the file's parsed form: the world's next commit reads this version.
        table_metadata.CACHE.put((self.spec.name, key), location, metadata)
        if self.staging:
            self._staged[key] = _Staged(key, content_id, metadata, location)
            return
        head = self.client.get_reference(self.spec.name).hash
        op = put_table(key, metadata, location, content_id)
        try:
            self.client.commit(self.spec.name, head, [op], message=message, author=self.author)
        except NessieConflict as exc:
            raise CommitFailedException(str(exc)) from exc
        except CommitStateUnknown as exc:
            raise CommitStateUnknownException(str(exc)) from exc

    def drop_table(self, identifier: str | Identifier) -> None:
        self._require_writable()
        key = self._identifier(identifier)
        if self._content(key) is None:
            raise NoSuchTableError(f"table does not exist: {'.'.join(key)}")
        self._delete_key(key, f"drop table {'.'.join(key)}")

    def _delete_key(self, key: Identifier, message: str) -> None:
        if self.staging:
            raise NotImplementedError("dropping inside a staged transaction is not supported")
        head = self.client.get_reference(self.spec.name).hash
        try:
            self.client.commit(
                self.spec.name, head, [Operation.delete(tuple(key))], message=message, author=self.author
            )
        except NessieConflict as exc:
            raise CommitFailedException(str(exc)) from exc

    def rename_table(self, from_identifier: str | Identifier, to_identifier: str | Identifier) -> Table:
        raise NotImplementedError("rename is not supported by causeway's Nessie catalog")

    def _entries(self) -> list[tuple[Identifier, str]]:
        return [(e.key, e.type.upper()) for e in self.client.get_entries(self.read_ref)]

    def create_namespace(self, namespace: str | Identifier, properties: Properties = EMPTY_DICT) -> None:
        self._require_writable()
        ns = self.identifier_to_tuple(namespace)
        if self.namespace_exists(ns):
            raise NamespaceAlreadyExistsError(f"namespace already exists: {'.'.join(ns)}")
        if self.staging:
            self._staged_namespaces.add(ns)
            return
        head = self.client.get_reference(self.spec.name).hash
        try:
            self.client.commit(
                self.spec.name,
                head,
                [Operation.put_namespace(ns)],
                message=f"create namespace {'.'.join(ns)}",
                author=self.author,
            )
        except NessieConflict as exc:
            raise NamespaceAlreadyExistsError(str(exc)) from exc

    def drop_namespace(self, namespace: str | Identifier) -> None:
        self._require_writable()
        ns = self.identifier_to_tuple(namespace)
        if not self.namespace_exists(ns):
            raise NoSuchNamespaceError(f"namespace does not exist: {'.'.join(ns)}")
        if self.list_tables(ns):
            raise NamespaceNotEmptyError(f"namespace is not empty: {'.'.join(ns)}")
        self._delete_key(ns, f"drop namespace {'.'.join(ns)}")

    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        ns = self.identifier_to_tuple(namespace)
        return [k for k, t in self._entries() if t == ICEBERG_TABLE and k[:-1] == ns]

    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        prefix = self.identifier_to_tuple(namespace) if namespace else ()
        return [
            k for k, t in self._entries() if t == NAMESPACE and k[: len(prefix)] == prefix and len(k) == len(prefix) + 1
        ]

    def namespace_exists(self, namespace: str | Identifier) -> bool:
        ns = self.identifier_to_tuple(namespace)
        if ns in self._staged_namespaces:
            return True
        return isinstance(self._content(ns), Namespace)

    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        if not self.namespace_exists(namespace):
            raise NoSuchNamespaceError(f"namespace does not exist: {namespace}")
        return {}

    def update_namespace_properties(
        self, namespace: str | Identifier, removals: set[str] | None = None, updates: Properties = EMPTY_DICT
    ) -> PropertiesUpdateSummary:
        raise NotImplementedError("namespace properties are not used by causeway")

    def list_views(self, namespace: str | Identifier) -> list[Identifier]:
        return []

    def view_exists(self, identifier: str | Identifier) -> bool:
        return False

    def drop_view(self, identifier: str | Identifier) -> None:
        raise NotImplementedError("views are not supported")

    def load_view(self, identifier: str | Identifier) -> Any:
        raise NotImplementedError("views are not supported")

    def register_view(self, identifier: str | Identifier, metadata_location: str) -> Any:
        raise NotImplementedError("views are not supported")
