"""The world manager's read-and-rewind API: history, releases, time travel, audit, diff, rollback.

Synchronous (pyiceberg is), one object per process; the CLI and the future gRPC service call it.
Pure decisions live in ``worlds.history``, ``worlds.refs``, ``worlds.audit``, ``worlds.diff`` and
``worlds.rollback``; this module only reads Nessie and the warehouse and writes Nessie.

Every read is pinned: a ref is resolved once to ``branch@hash`` (or ``tag@hash``) and all tables
are read at that hash, so a read never blocks the live writer and never sees half of a commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
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
from pyiceberg.manifest import ManifestEntryStatus, read_manifest_list
from pyiceberg.table import DataScan, Table

from sinks.errors import NessieError
from sinks.nessie import IcebergTable, Operation
from sinks.tables import ENTITY_COMMON, ENTITY_EDGE, ENTITY_EVENTS
from worlds import history as hist
from worlds.audit import AUDIT_COLUMNS, AuditEntry, fold, missing_causes
from worlds.diff import EntityChange, SchemaChange, schema_diff
from worlds.diff_read import TableDiff, diff_table
from worlds.errors import WorldsError
from worlds.merge import Strategies
from worlds.merge_run import MergeOps
from worlds.refs import Resolved, WorldRef
from worlds.releases import Release, ReleaseOps
from worlds.rollback import RollbackPlan
from worlds.rollback_run import RollbackOps, RollbackOutcome

TABLES = (ENTITY_EVENTS, ENTITY_COMMON, ENTITY_EDGE)


@dataclass(frozen=True)
class Snapshot:
    """A world read at one commit: live objects and links (tombstones left out unless asked)."""

    resolved: Resolved
    objects: pa.Table
    links: pa.Table


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


class MergeResult(Protocol):
    """What a merge answers the CLI: ``worlds.merge_run.MergeOutcome`` or its twin over the API."""

    @property
    def status(self) -> str: ...

    @property
    def dry_run(self) -> bool: ...

    def to_json(self) -> dict[str, Any]: ...


class WorldsApi(Protocol):
    """The world commands' calls, stated once: :class:`Worlds` answers them on Nessie directly,
    ``api.remote_worlds.RemoteWorlds`` over the world manager API (mypy checks both against this)."""

    def history(
        self,
        world: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        author: str | None = None,
        limit: int | None = 50,
        counts: bool = True,
        changes: bool = False,
    ) -> Iterator[hist.CommitRecord]: ...

    def create_release(self, world: str, name: str, message: str = "") -> tuple[Release, bool]: ...

    def list_releases(self, world: str | None = None) -> list[Release]: ...

    def get_release(self, world: str, name: str) -> Release: ...

    def delete_release(self, world: str, name: str) -> Release: ...

    def show(self, ref: str, *, entity_type: str | None = None, pk: str | None = None) -> Snapshot: ...

    def audit(
        self,
        ref: str,
        entity_type: str,
        pk: str,
        *,
        kind: str = "object",
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[AuditEntry]: ...

    def diff(self, a: str, b: str, *, progress: Callable[[int], None] | None = None) -> WorldDiff: ...

    def plan_rollback(self, world: str, to: str) -> RollbackPlan: ...

    def rollback(self, world: str, to: str, *, force: bool = False) -> RollbackOutcome: ...

    def merge_worlds(
        self, source: str, into: str, strategy: Strategies, *, dry_run: bool = False, message: str | None = None
    ) -> MergeResult: ...

    def continue_merge(self, target: str, *, message: str | None = None) -> MergeResult: ...

    def abort_merge(self, target: str) -> None: ...

    def pending_merge(self, target: str) -> dict[str, Any]: ...

    def resolve_conflict(self, target: str, conflict_id: int, take: str) -> dict[str, Any]: ...


class Worlds(ReleaseOps, RollbackOps, MergeOps):
    """The API. ``Worlds.from_settings(settings)``; close with ``close()`` or use ``with``."""

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
        changes: bool = False,
        page_size: int = 100,
    ) -> Iterator[hist.CommitRecord]:
        """The world's commits, newest first, paged through Nessie's log (one page in memory).

        ``counts``: rows added and removed per table, from snapshot summaries (metadata reads only).
        ``changes``: events per kind and change type are read from each commit's properties; with
        ``changes`` they are also counted from the log file(s) of older commits that lack them.
        """
        branch = self.head(world).name
        flt = hist.history_filter(since, until, author)
        size = max(1, min(page_size, limit or page_size))
        seen = 0
        for page in self.client.history(branch, max_records=size, filter=flt, fetch_all=counts or changes):
            for entry in page:
                ops = entry.operations or ()
                tables = self._commit_counts(ops) if counts else {}
                # Commits since the committer records its change counts carry them; older ones need a read.
                changed = self._commit_changes(ops) if changes and hist.PROP_CHANGES not in entry.properties else {}
                yield hist.record(
                    entry.hash, entry.commit_time, entry.author, entry.message, entry.properties, tables, changed
                )
                seen += 1
                if limit is not None and seen >= limit:
                    return

    def _previous_snapshot(self, meta: dict[str, Any]) -> tuple[int | None, int | None]:
        """The current snapshot id and sequence number of the metadata version ``meta`` replaced."""
        prev_loc = hist.previous_metadata_location(meta)
        prev = self.metadata(prev_loc) if prev_loc else {}
        old_id = prev.get("current-snapshot-id")
        return old_id, hist.snapshot_sequence(prev, old_id)

    def _commit_changes(self, operations: tuple[Operation, ...]) -> dict[str, dict[str, int]]:
        """Count the rows of the ``entity_events`` files this commit's snapshot added (not a table scan)."""
        for op in operations:
            if op.type != "PUT" or not isinstance(op.content, IcebergTable):
                continue
            if tuple(op.key) != (self.settings.namespace, ENTITY_EVENTS):
                continue
            meta = self.metadata(op.content.metadata_location)
            snap = next((s for s in meta.get("snapshots") or () if s["snapshot-id"] == op.content.snapshot_id), None)
            old_id, old_seq = self._previous_snapshot(meta)
            if (
                snap is None
                or snap["snapshot-id"] == old_id
                or int(snap.get("sequence-number") or 0) <= (old_seq or -1)
            ):
                return {}  # the commit made no new log snapshot (a schema change, a rollback)
            io = load_file_io(self.catalog.properties, op.content.metadata_location)
            kinds: list[str] = []
            types: list[str] = []
            applied: list[bool] = []
            for manifest in read_manifest_list(io.new_input(snap["manifest-list"])):
                if manifest.added_snapshot_id != snap["snapshot-id"]:
                    continue
                for e in manifest.fetch_manifest_entry(io, discard_deleted=True):
                    if e.status != ManifestEntryStatus.ADDED or e.snapshot_id != snap["snapshot-id"]:
                        continue
                    with io.new_input(e.data_file.file_path).open() as f:
                        rows = pq.read_table(f, columns=["kind", "change_type", "applied"])
                    kinds += rows.column("kind").to_pylist()
                    types += rows.column("change_type").to_pylist()
                    applied += rows.column("applied").to_pylist()
            return hist.change_counts(kinds, types, applied)
        return {}

    def _commit_counts(self, operations: tuple[Operation, ...]) -> dict[str, hist.TableCounts]:
        out: dict[str, hist.TableCounts] = {}
        for op in operations:
            if op.type != "PUT" or not isinstance(op.content, IcebergTable):
                continue
            if tuple(op.key[:-1]) != (self.settings.namespace,):
                continue
            meta = self.metadata(op.content.metadata_location)
            old_id, old_seq = self._previous_snapshot(meta)
            out[op.key[-1]] = hist.new_snapshot_counts(meta, op.content.snapshot_id, old_id, old_seq)
        return out

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
            found = log.scan(row_filter=In("event_id", sorted(wanted)), selected_fields=("event_id", "caused_by"))  # type: ignore[call-arg,arg-type]
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
        # The log's rows are sorted by entity inside a flush (table layout), so a batch's own order is
        # its ``batch_seq`` column; tables from before the layout have no such column.
        names = {f.name for f in log.schema().fields}
        fields = AUDIT_COLUMNS + (("batch_seq",) if "batch_seq" in names else ())
        return log, log.scan(row_filter=row_filter, selected_fields=fields)

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


def _filter(
    *equal: tuple[str, Any], lower: tuple[str, Any] | None = None, upper: tuple[str, Any] | None = None
) -> BooleanExpression:
    expr: BooleanExpression = AlwaysTrue()
    for column, value in equal:
        if value is not None:
            expr = And(expr, EqualTo(column, value))  # type: ignore[call-arg,arg-type]
    if lower is not None and lower[1] is not None:
        expr = And(expr, GreaterThanOrEqual(lower[0], lower[1]))  # type: ignore[call-arg,arg-type]
    if upper is not None and upper[1] is not None:
        expr = And(expr, LessThanOrEqual(upper[0], upper[1]))  # type: ignore[call-arg,arg-type]
    return expr


__all__ = [
    "MergeResult",
    "NessieError",
    "Release",
    "Resolved",
    "RollbackOutcome",
    "Snapshot",
    "Worlds",
    "WorldsApi",
    "WorldsError",
]
