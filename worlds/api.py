"""The world manager's read-and-rewind API: history, releases, time travel, audit, diff, rollback.

Synchronous (pyiceberg is), one object per process; the CLI and the future gRPC service call it.
Pure decisions live in ``worlds.history``, ``worlds.refs``, ``worlds.audit``, ``worlds.diff`` and
``worlds.rollback``; this module only reads Nessie and the warehouse and writes Nessie.

Every read is pinned: a ref is resolved once to ``branch@hash`` (or ``tag@hash``) and all tables
are read at that hash, so a read never blocks the live writer and never sees half of a commit.
"""

from __future__ import annotations

import gzip
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
)
from pyiceberg.io import load_file_io
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table import DataScan, Table
from pyiceberg.table.metadata import TableMetadataUtil

from models.worlds import InvalidWorldId, WorldNaming
from sinks.catalog import NessieCatalog
from sinks.errors import NessieConflict, NessieError, NessieNotFound, NessieReferenceAlreadyExists
from sinks.nessie import CommitResult, IcebergTable, Operation, Reference, SyncNessieClient
from sinks.pointers import TablePointer, commit_pointers
from sinks.tables import ENTITY_COMMON, ENTITY_EDGE, ENTITY_EVENTS
from streams.settings import Settings
from worlds import history as hist
from worlds.audit import AUDIT_COLUMNS, AuditEntry, fold, missing_causes
from worlds.diff import EntityChange, SchemaChange, schema_diff
from worlds.diff_read import TableDiff, diff_table
from worlds.refs import InvalidRef, WorldRef, parse_release_tag, release_tag
from worlds.rollback import DROP, KEEP, RollbackPlan, plan_actions, restored_metadata, rolled_range

TABLES = (ENTITY_EVENTS, ENTITY_COMMON, ENTITY_EDGE)
#: The key a release commit marks as UNCHANGED: no table is touched, so it never conflicts.
RELEASE_MARKER_KEY = ("causeway_releases",)


class WorldsError(Exception):
    """A world read or rewind that cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class Resolved:
    """A world ref resolved to one commit: ``pinned`` (``name@hash``) is what every read uses."""

    ref: WorldRef
    name: str  # the branch or tag
    hash: str
    commit_time: datetime | None = None

    @property
    def pinned(self) -> str:
        return f"{self.name}@{self.hash}"

    def describe(self) -> str:
        when = f" ({self.commit_time.isoformat()})" if self.commit_time else ""
        return f"{self.ref} = commit {self.hash[:16]} on {self.name}{when}"


@dataclass(frozen=True)
class Release:
    world: str
    name: str
    tag: str
    hash: str
    released_hash: str
    message: str
    created_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "world": self.world,
            "name": self.name,
            "tag": self.tag,
            "hash": self.hash,
            "released_hash": self.released_hash,
            "message": self.message,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }


@dataclass(frozen=True)
class Snapshot:
    """A world read at one commit: live objects and links (tombstones left out unless asked)."""

    resolved: Resolved
    objects: pa.Table
    links: pa.Table


@dataclass(frozen=True)
class RollbackOutcome:
    """A rollback's plan and the commit it made (None: the world already was at the target state)."""

    plan: RollbackPlan
    hash: str | None
    attempts: int


@dataclass(frozen=True)
class WorldDiff:
    """``a`` → ``b``: per projection table the entity changes, schema changes and read costs."""

    a: Resolved
    b: Resolved
    tables: list[TableDiff]
    events_schema: list[SchemaChange]

    @property
    def changes(self) -> list[EntityChange]:
        return [c for t in self.tables for c in t.changes]

    def counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{"object": {type: {added, removed, modified}}, "link": {...}}``."""
        out: dict[str, dict[str, dict[str, int]]] = {"object": {}, "link": {}}
        for t in self.tables:
            for c in t.changes:
                per = out[c.kind].setdefault(c.entity_type, {"added": 0, "removed": 0, "modified": 0})
                per[c.change] += 1
        return out


class Worlds:
    """The API. ``Worlds.from_settings(settings)``; close with ``close()`` or use ``with``."""

    def __init__(self, settings: Settings, client: SyncNessieClient | None = None) -> None:
        self.settings = settings
        self.naming = WorldNaming(settings.prod_world, settings.main_branch)
        self._own_client = client is None
        self.client = client or SyncNessieClient.from_settings(settings)
        self.catalog = NessieCatalog.from_settings(settings, settings.main_branch, client=self.client)
        self._metadata_cache: dict[str, dict[str, Any]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> Worlds:
        return cls(settings)

    def close(self) -> None:
        if self._own_client:
            self.client.close()

    def __enter__(self) -> Worlds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- refs ------------------------------------------------------------------------------------

    def branch(self, world: str) -> str:
        try:
            return self.naming.branch(world)
        except InvalidWorldId as exc:
            raise WorldsError(str(exc)) from exc

    def head(self, world: str) -> Reference:
        try:
            return self.client.get_reference(self.branch(world))
        except NessieNotFound as exc:
            raise WorldsError(f"world {world!r} does not exist (no branch {self.branch(world)})") from exc

    def resolve(self, ref: WorldRef | str) -> Resolved:
        """One commit for a world ref: the head, a hash on the branch, the last commit at a time, a release."""
        wref = _parse(ref)
        if wref.release:
            tag = release_tag(wref.world, wref.release)
            try:
                found = self.client.get_reference(tag)
            except NessieNotFound as exc:
                raise WorldsError(f"release {wref} does not exist") from exc
            return Resolved(wref, tag, found.hash, self._commit_time(f"{tag}@{found.hash}"))
        branch = self.head(wref.world).name
        if wref.hash:
            try:
                entry = self._first(f"{branch}@{self._expand(branch, wref.hash)}")
            except NessieNotFound as exc:
                raise WorldsError(f"commit {wref.hash} is not on world {wref.world!r}") from exc
            if entry is None:
                raise WorldsError(f"commit {wref.hash} is not on world {wref.world!r}")
            return Resolved(wref, branch, entry.hash, entry.commit_time)
        if wref.at:
            ms = int(wref.at.timestamp() * 1000)
            try:
                entry = self._first(f"{branch}*{ms}")
            except NessieNotFound:
                entry = None
            if entry is None:
                raise WorldsError(f"world {wref.world!r} has no commit at or before {wref.at.isoformat()}")
            return Resolved(wref, branch, entry.hash, entry.commit_time)
        entry = self._first(branch)
        if entry is None:
            raise WorldsError(f"world {wref.world!r} has no commit")
        return Resolved(wref, branch, entry.hash, entry.commit_time)

    def _expand(self, branch: str, prefix: str, max_commits: int = 100_000) -> str:
        """A full commit hash from the prefix the CLI prints (Nessie resolves full hashes only)."""
        if len(prefix) == 64:
            return prefix
        for n, entry in enumerate(self.client.history_entries(branch, max_records=500)):
            if entry.hash.startswith(prefix):
                return entry.hash
            if n >= max_commits:
                break
        raise WorldsError(f"commit {prefix} is not on branch {branch} (within {max_commits:,} commits)")

    def _first(self, ref: str) -> Any:
        for page in self.client.history(ref, max_records=1):
            return next(iter(page), None)
        return None

    def _commit_time(self, ref: str) -> datetime | None:
        entry = self._first(ref)
        return entry.commit_time if entry else None

    def table(self, pinned: str, name: str) -> Table | None:
        """A table read at a pinned ref, or None when the world has no such table there."""
        try:
            return self.catalog.at(pinned).load_table((self.settings.namespace, name))
        except NoSuchTableError:
            return None

    # --- 1. history ------------------------------------------------------------------------------

    def history(
        self,
        world: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        author: str | None = None,
        limit: int | None = 50,
        counts: bool = True,
        page_size: int = 100,
    ) -> Iterator[hist.CommitRecord]:
        """The world's commits, newest first, paged through Nessie's log (one page in memory)."""
        branch = self.head(world).name
        flt = hist.history_filter(since, until, author)
        size = max(1, min(page_size, limit or page_size))
        seen = 0
        for page in self.client.history(branch, max_records=size, filter=flt, fetch_all=counts):
            for entry in page:
                tables = self._commit_counts(entry.operations or ()) if counts else {}
                yield hist.record(entry.hash, entry.commit_time, entry.author, entry.message, entry.properties, tables)
                seen += 1
                if limit is not None and seen >= limit:
                    return

    def _commit_counts(self, operations: tuple[Operation, ...]) -> dict[str, hist.TableCounts]:
        out: dict[str, hist.TableCounts] = {}
        for op in operations:
            if op.type != "PUT" or not isinstance(op.content, IcebergTable):
                continue
            if tuple(op.key[:-1]) != (self.settings.namespace,):
                continue
            meta = self.metadata(op.content.metadata_location)
            prev_loc = hist.previous_metadata_location(meta)
            prev = self.metadata(prev_loc) if prev_loc else {}
            old_id = prev.get("current-snapshot-id")
            old_seq = hist.snapshot_sequence(prev, old_id)
            out[op.key[-1]] = hist.new_snapshot_counts(meta, op.content.snapshot_id, old_id, old_seq)
        return out

    def metadata(self, location: str) -> dict[str, Any]:
        """A table metadata file as raw JSON (files are immutable: cached by location)."""
        cached = self._metadata_cache.get(location)
        if cached is not None:
            return cached
        io = load_file_io(self.catalog.properties, location)
        with io.new_input(location).open() as f:
            raw = f.read()
        if location.endswith(".gz.metadata.json") or raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = orjson.loads(raw)
        if len(self._metadata_cache) > 4096:
            self._metadata_cache.clear()
        self._metadata_cache[location] = data
        return data

    # --- 3. releases -----------------------------------------------------------------------------

    def create_release(self, world: str, name: str, message: str = "") -> tuple[Release, bool]:
        """Tag the world's head as release ``name``; returns (release, created).

        A release is immutable: creating an existing name again is a no-op when it already holds the
        world's current state, and refused otherwise (Nessie would let a tag move; causeway does not).
        The release is recorded on the world's branch as a commit that touches no table.
        """
        tag = self._release_tag(world, name)
        head = self.head(world)
        existing = self._get_tag(tag)
        if existing is not None:
            release = self._release(tag, existing.hash)
            if head.hash in (release.hash, release.released_hash):
                return release, False
            raise WorldsError(
                f"release {world}/{name} exists at {release.released_hash[:16]}; releases are immutable "
                f"(the world is now at {head.hash[:16]}): pick another name"
            )
        props = {hist.PROP_RELEASE: name, "causeway.release.of": head.hash, "causeway.world": world}
        if message:
            props["causeway.release.message"] = message
        marker = self.client.commit(
            head.name,
            head.hash,
            [Operation("UNCHANGED", RELEASE_MARKER_KEY)],
            message=f"release {name} of world {world}" + (f": {message}" if message else ""),
            author=self.settings.commit_author,
            properties=props,
        )
        try:
            self.client.create_tag(tag, Reference(head.name, "BRANCH", marker.hash))
        except NessieReferenceAlreadyExists as exc:
            raise WorldsError(f"release {world}/{name} was created concurrently; run `release show`") from exc
        return self._release(tag, marker.hash), True

    def list_releases(self, world: str | None = None) -> list[Release]:
        out = []
        for ref in self.client.list_references():
            parsed = parse_release_tag(ref.name) if ref.type == "TAG" else None
            if parsed and (world is None or parsed[0] == world):
                out.append(self._release(ref.name, ref.hash))
        return sorted(out, key=lambda r: (r.world, r.created_at or datetime.min, r.name))

    def get_release(self, world: str, name: str) -> Release:
        tag = self._release_tag(world, name)
        found = self._get_tag(tag)
        if found is None:
            raise WorldsError(f"release {world}/{name} does not exist")
        return self._release(tag, found.hash)

    def delete_release(self, world: str, name: str) -> Release:
        release = self.get_release(world, name)
        self.client.delete_reference(release.tag, release.hash, "TAG")
        return release

    def _release_tag(self, world: str, name: str) -> str:
        try:
            self.branch(world)
            return release_tag(world, name)
        except (InvalidRef, InvalidWorldId) as exc:
            raise WorldsError(str(exc)) from exc

    def _get_tag(self, tag: str) -> Reference | None:
        try:
            return self.client.get_reference(tag)
        except NessieNotFound:
            return None

    def _release(self, tag: str, hash: str) -> Release:
        world, name = parse_release_tag(tag) or ("?", tag)
        entry = self._first(f"{tag}@{hash}")
        props = entry.properties if entry else {}
        return Release(
            world=world,
            name=name,
            tag=tag,
            hash=hash,
            released_hash=props.get("causeway.release.of", hash),
            message=props.get("causeway.release.message", ""),
            created_at=entry.commit_time if entry else None,
        )

    # --- 4. time travel --------------------------------------------------------------------------

    def show(
        self,
        ref: WorldRef | str,
        *,
        entity_type: str | None = None,
        pk: str | None = None,
        include_deleted: bool = False,
    ) -> Snapshot:
        """Objects and links of a world as of a ref, filtered by type and pk (pushed down to the scan)."""
        resolved = self.resolve(ref)
        objects = self._scan(resolved.pinned, ENTITY_COMMON, "object_type_id", "object_pk", entity_type, pk)
        links = self._scan(resolved.pinned, ENTITY_EDGE, "link_type", "link_pk", entity_type, pk)
        if not include_deleted:
            objects = objects.filter(pc.invert(objects.column("deleted"))) if objects.num_rows else objects
            links = links.filter(pc.invert(links.column("deleted"))) if links.num_rows else links
        return Snapshot(resolved, objects, links)

    def _scan(
        self, pinned: str, name: str, type_col: str, pk_col: str, entity_type: str | None, pk: str | None
    ) -> pa.Table:
        tbl = self.table(pinned, name)
        if tbl is None:
            return pa.table({})
        return tbl.scan(row_filter=_filter((type_col, entity_type), (pk_col, pk))).to_arrow()

    # --- 5. audit trail --------------------------------------------------------------------------

    def audit(
        self,
        ref: WorldRef | str,
        entity_type: str,
        pk: str,
        *,
        kind: str = "object",
        since: datetime | None = None,
        until: datetime | None = None,
        cause_depth: int = 8,
    ) -> list[AuditEntry]:
        """Every change of one object (or link) in the order the world took it, with commits and causes.

        The log is scanned with (kind, type, pk, committed_at range) pushed down, so only files whose
        statistics can hold the entity are read.
        """
        resolved = self.resolve(ref)
        scan = self.audit_scan(resolved, entity_type, pk, kind=kind, since=since, until=until)
        if scan is None:
            return []
        log, rows = scan[0], scan[1].to_arrow().to_pylist()
        causes: dict[str, str | None] = {r["event_id"]: r["caused_by"] for r in rows}
        for _ in range(cause_depth):
            wanted = missing_causes(causes)
            if not wanted:
                break
            found = log.scan(row_filter=In("event_id", sorted(wanted)), selected_fields=("event_id", "caused_by"))
            got = {r["event_id"]: r["caused_by"] for r in found.to_arrow().to_pylist()}
            causes.update(got)
            causes.update({w: None for w in wanted - set(got)})  # a cause outside the log ends its chain
        commits = self._batch_commits(resolved, {r["batch_id"] for r in rows}, rows)
        return fold(rows, causes, commits)

    def audit_scan(
        self,
        resolved: Resolved,
        entity_type: str,
        pk: str,
        *,
        kind: str = "object",
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> tuple[Table, DataScan] | None:
        """The log and the pushed-down scan of one entity's rows (``plan_files()`` shows the files read)."""
        log = self.table(resolved.pinned, ENTITY_EVENTS)
        if log is None:
            return None
        row_filter = _filter(
            ("kind", kind),
            ("entity_type", entity_type),
            ("entity_pk", pk),
            lower=("committed_at", since),
            upper=("committed_at", until),
        )
        return log, log.scan(row_filter=row_filter, selected_fields=AUDIT_COLUMNS)

    def _batch_commits(self, resolved: Resolved, batch_ids: set[str], rows: list[dict[str, Any]]) -> dict[str, str]:
        """Commit hash per batch id, walking the log back only to the oldest row's commit time."""
        if not batch_ids:
            return {}
        oldest = min(r["committed_at"] for r in rows) - timedelta(minutes=5)
        flt = hist.history_filter(since=oldest)
        found: dict[str, str] = {}
        for entry in self.client.history_entries(resolved.pinned, max_records=200, filter=flt):
            b = entry.properties.get(hist.PROP_BATCH)
            if b in batch_ids and b not in found:
                found[b] = entry.hash
                if len(found) == len(batch_ids):
                    break
        return found

    # --- 2. diff ---------------------------------------------------------------------------------

    def diff(self, a: WorldRef | str, b: WorldRef | str, *, progress: Callable[[int], None] | None = None) -> WorldDiff:
        """Entities added, removed and modified (with their property changes) from ``a`` to ``b``.

        Reads only the data files that differ between the two snapshots (see ``worlds.diff``).
        """
        ra, rb = self.resolve(a), self.resolve(b)
        tables = []
        for name, kind, type_col, pk_col in (
            (ENTITY_COMMON, "object", "object_type_id", "object_pk"),
            (ENTITY_EDGE, "link", "link_type", "link_pk"),
        ):
            ta, tb = self.table(ra.pinned, name), self.table(rb.pinned, name)
            tables.append(diff_table(name, kind, ta, tb, type_col, pk_col, progress))
        events_a, events_b = self.table(ra.pinned, ENTITY_EVENTS), self.table(rb.pinned, ENTITY_EVENTS)
        events_schema = schema_diff(events_a.schema() if events_a else None, events_b.schema() if events_b else None)
        return WorldDiff(ra, rb, tables, events_schema)

    # --- 6. rollback -----------------------------------------------------------------------------

    def plan_rollback(self, world: str, to: WorldRef | str, *, max_commits: int = 100_000) -> RollbackPlan:
        """What ``rollback`` would do now: the tables to restore and the commits it rolls back."""
        head = self.head(world)
        target = self.resolve(to)
        if target.ref.world != world:
            raise WorldsError(f"the rollback target {target.ref} is not a state of world {world!r}")
        entries = self.client.history_entries(head.name + "@" + head.hash, max_records=200)
        walked = ((e.hash, e.properties) for _, e in zip(range(max_commits + 1), entries, strict=False))
        found = rolled_range(list(walked), target.hash)
        if found is None:
            raise WorldsError(
                f"{target.describe()} is not in the history of world {world!r} (within {max_commits:,} commits)"
            )
        hashes, batches = found
        keys = [(self.settings.namespace, t) for t in TABLES]
        at_target = self.client.get_contents(target.pinned, keys)
        at_head = self.client.get_contents(head.pinned, keys)
        actions = plan_actions(TABLES, _locations(at_target), _locations(at_head))
        return RollbackPlan(world, head.name, head.hash, target.hash, actions, hashes, batches)

    def rollback(self, world: str, to: WorldRef | str, *, force: bool = False) -> RollbackOutcome:
        """Commit the target's tables as a new commit on the world's branch, expecting the head planned.

        If the branch moves meanwhile (a worker committed), Nessie refuses the commit and nothing
        changes; with ``force`` the rollback is planned and tried once more from the new head.
        """
        for attempt in (1, 2):
            plan = self.plan_rollback(world, to)
            if plan.noop:
                return RollbackOutcome(plan, None, attempt)
            try:
                result = self._commit_rollback(plan)
            except NessieConflict as exc:
                if force and attempt == 1:
                    continue
                raise WorldsError(
                    f"world {world!r} moved during the rollback (head was {plan.head[:16]}); nothing changed. "
                    "Run it again, or pass --force to retry once from the new head"
                ) from exc
            return RollbackOutcome(plan, result.hash, attempt)
        raise AssertionError("unreachable")

    def _commit_rollback(self, plan: RollbackPlan) -> CommitResult:
        ns = self.settings.namespace
        keys = [(ns, t) for t in TABLES]
        head_contents = self.client.get_contents(f"{plan.branch}@{plan.head}", keys)
        now_ms = int(time.time() * 1000)
        puts, deletes, unchanged = [], [], []
        for action in plan.actions:
            key = (ns, action.table)
            if action.action == KEEP:
                unchanged.append(key)
                continue
            if action.action == DROP:
                deletes.append(key)
                continue
            assert action.target_location is not None
            target_meta = self.metadata(action.target_location)
            head_meta = self.metadata(action.head_location) if action.head_location else None
            new_meta = restored_metadata(target_meta, head_meta, action.head_location, now_ms)
            location = _next_metadata_location(new_meta, action.head_location or action.target_location)
            _write_metadata_json(self.catalog.properties, location, new_meta)
            current = head_contents.get(key)
            puts.append(TablePointer(key, location, new_meta, current.id if current is not None else None))
        return commit_pointers(
            self.client,
            plan.branch,
            plan.head,
            puts=puts,
            deletes=deletes,
            unchanged=unchanged,
            message=plan.message(),
            author=self.settings.commit_author,
            properties=plan.properties(),
        )


def _filter(
    *equal: tuple[str, Any], lower: tuple[str, Any] | None = None, upper: tuple[str, Any] | None = None
) -> BooleanExpression:
    expr: BooleanExpression = AlwaysTrue()
    for column, value in equal:
        if value is not None:
            expr = And(expr, EqualTo(column, value))
    if lower is not None and lower[1] is not None:
        expr = And(expr, GreaterThanOrEqual(lower[0], lower[1]))
    if upper is not None and upper[1] is not None:
        expr = And(expr, LessThanOrEqual(upper[0], upper[1]))
    return expr


def _locations(contents: Mapping[tuple[str, ...], Any]) -> dict[str, str | None]:
    return {k[-1]: c.metadata_location for k, c in contents.items() if isinstance(c, IcebergTable)}


def _next_metadata_location(metadata: Mapping[str, Any], previous: str) -> str:
    """``<table>/metadata/<version+1>-<uuid>.metadata.json`` after ``previous`` (pyiceberg's naming)."""
    version = NessieCatalog._parse_metadata_version(previous)
    base = str(metadata.get("location", "")).rstrip("/")
    return f"{base}/metadata/{max(version, 0) + 1:05d}-{uuid.uuid4()}.metadata.json"


def _write_metadata_json(properties: Mapping[str, str], location: str, metadata: Mapping[str, Any]) -> None:
    """Validate ``metadata`` as Iceberg table metadata and write it as a new file."""
    parsed = TableMetadataUtil.parse_obj(dict(metadata))
    io = load_file_io(dict(properties), location)
    ToOutputFile.table_metadata(parsed, io.new_output(location))


def _parse(ref: WorldRef | str) -> WorldRef:
    if isinstance(ref, WorldRef):
        return ref
    try:
        return WorldRef.parse(ref)
    except InvalidRef as exc:
        raise WorldsError(str(exc)) from exc


__all__ = ["NessieError", "Release", "Resolved", "Snapshot", "Worlds", "WorldsError"]
