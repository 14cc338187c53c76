"""The world commands' calls over the API: ``worlds.api.Worlds``'s methods, answered by ``causeway serve``.

``cli.world_history`` and ``cli.world_merge`` use :class:`RemoteWorlds` instead of ``Worlds`` when
``CAUSEWAY_API_URL`` is set, so operators go through the API's tokens, roles, idempotency keys and
audit log. Each method returns what its ``Worlds`` twin returns (the same typed records, rebuilt from
the messages' JSON), so the commands print one way whichever path answered. A gRPC error becomes a
:class:`WorldsError` naming the status code: one error line and exit code 1, as on the local path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import grpc
import orjson
import pyarrow as pa

from api import world_manager_pb2 as pb
from api.client import WorldClient
from api.remote import Remote
from worlds.api import Snapshot, WorldDiff
from worlds.audit import AuditEntry
from worlds.diff import EntityChange, PropertyChange, SchemaChange
from worlds.diff_read import TableDiff
from worlds.errors import WorldNotFound, WorldsError
from worlds.history import CommitRecord, TableCounts
from worlds.merge import Strategies
from worlds.refs import Resolved, WorldRef
from worlds.releases import Release
from worlds.rollback import RollbackPlan, TableAction
from worlds.rollback_run import RollbackOutcome


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _release(r: pb.Release) -> Release:
    return Release(r.world_id, r.name, r.tag, r.hash, r.released_hash, r.message, _time(r.created_at))


def _commit(c: pb.Commit, counts: bool) -> CommitRecord:
    doc = orjson.loads(c.json)
    return CommitRecord(
        hash=doc["hash"],
        time=datetime.fromisoformat(doc["time"]),
        author=doc["author"],
        message=doc["message"],
        kind=doc["kind"],
        batch_ids=tuple(doc.get("batch_ids", ())),
        event_count=doc.get("event_count"),
        properties=doc.get("properties", {}),
        tables={name: TableCounts(**t) for name, t in doc.get("tables", {}).items()} if counts else {},
        changes=doc.get("changes", {}),
    )


def _change(d: dict[str, Any]) -> EntityChange:
    return EntityChange(
        kind=d["kind"],
        entity_type=d["type"],
        pk=d["pk"],
        change=d["change"],
        before=d["before"],
        after=d["after"],
        properties=tuple(PropertyChange(name, v[0], v[1]) for name, v in d["properties"].items()),
        version_before=d["version"][0],
        version_after=d["version"][1],
    )


def _entry(d: dict[str, Any]) -> AuditEntry:
    return AuditEntry(
        event_id=d["event_id"],
        change_type=d["change_type"],
        version=d["version"],
        before=d["before"],
        after=d["after"],
        applied=d["applied"],
        caused_by=tuple(d["caused_by"]),
        occurred_at=datetime.fromisoformat(d["occurred_at"]),
        committed_at=datetime.fromisoformat(d["committed_at"]),
        batch_id=d["batch_id"],
        commit_hash=d["commit"],
        source=d["source"],
        from_pk=d.get("from_pk"),
        to_pk=d.get("to_pk"),
    )


def _plan(resp: pb.RollbackResponse) -> RollbackPlan:
    d = orjson.loads(resp.json)
    return RollbackPlan(
        world=d["world"],
        branch=d["branch"],
        head=d["head"],
        target=d["target"],
        actions=tuple(TableAction(**a) for a in d["actions"]),
        rolled_back=tuple(d["rolled_back"]),
        batch_ids=tuple(d["batch_ids"]),
    )


class Outcome:
    """A merge outcome as the server sent it: the document ``MergeOutcome.to_json`` writes."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.status: str = doc["status"]
        self.dry_run: bool = bool(doc.get("dry_run"))

    def to_json(self) -> dict[str, Any]:
        return self.doc

    @classmethod
    def of(cls, resp: pb.MergeResponse) -> Outcome:
        if not resp.json:
            raise WorldsError(f"the server sent merge status {resp.status!r} without its outcome")
        doc = orjson.loads(resp.json)
        listed = [orjson.loads(c.json) for c in resp.conflicts if c.conflict != "SCHEMA"]
        read = doc.pop("read", {})
        return cls(doc | {"conflict_list": listed, "read": read})  # in MergeOutcome.to_json's key order


class RemoteWorlds(Remote):
    """The subset of ``worlds.api.Worlds`` the CLI's world commands call, over gRPC."""

    # --- history and releases --------------------------------------------------------------------

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
    ) -> Iterator[CommitRecord]:
        req = pb.CommitHistoryRequest(
            world_id=world,
            since=since.isoformat() if since else "",
            until=until.isoformat() if until else "",
            author=author or "",
            limit=limit or 0,
            changes=changes,
            no_counts=not counts,
        )
        pages = self.client.stream("GetCommitHistory", req)
        while True:
            page = self._call(lambda: next(pages, None))
            if page is None:
                return
            yield from (_commit(c, counts) for c in page.commits)

    def create_release(self, world: str, name: str, message: str = "") -> tuple[Release, bool]:
        resp = self._call(lambda: self.client.create_release(world, name, message))
        return _release(resp.release), resp.created

    def list_releases(self, world: str | None = None) -> list[Release]:
        found = [_release(r) for r in self._call(lambda: self.client.list_releases(world or ""))]
        return sorted(found, key=lambda r: (r.world, r.created_at or datetime.min, r.name))

    def get_release(self, world: str, name: str) -> Release:
        for r in self.list_releases(world):
            if r.name == name:
                return r
        raise WorldNotFound(f"release {world}/{name} does not exist")

    def delete_release(self, world: str, name: str) -> Release:
        resp = self._call(lambda: self.client.delete_release(world, name))
        if not resp.deleted:  # what the local path says for a release that is not there
            raise WorldNotFound(f"release {world}/{name} does not exist")
        return _release(resp.release)

    # --- time travel and audit --------------------------------------------------------------------

    def show(self, ref: str, *, entity_type: str | None = None, pk: str | None = None) -> Snapshot:
        pages = list(self._call(lambda: list(self.client.query_at(ref, entity_type or "", pk or ""))))
        first = pages[0] if pages else pb.QueryAtResponse()
        resolved = Resolved(WorldRef.parse(ref), first.resolved_name, first.hash, _time(first.commit_time))
        objects = [orjson.loads(o) for p in pages for o in p.objects_json]
        links = [orjson.loads(lk) for p in pages for lk in p.links_json]
        return Snapshot(resolved, pa.Table.from_pylist(objects), pa.Table.from_pylist(links))

    def audit(
        self,
        ref: str,
        entity_type: str,
        pk: str,
        *,
        kind: str = "object",
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[AuditEntry]:
        req = pb.EntityAuditRequest(
            ref=ref,
            entity_type=entity_type,
            pk=pk,
            kind=kind,
            since=since.isoformat() if since else "",
            until=until.isoformat() if until else "",
        )
        pages = self._call(lambda: list(self.client.stream("GetEntityAudit", req)))
        return [_entry(orjson.loads(e.json)) for p in pages for e in p.entries]

    # --- diff -------------------------------------------------------------------------------------

    def diff(self, a: str, b: str, *, progress: Callable[[int], None] | None = None) -> WorldDiff:
        pages = self._call(lambda: list(self.client.stream("GetDiff", pb.DiffRequest(from_ref=a, to_ref=b))))
        changes = [_change(orjson.loads(c.json)) for p in pages for c in p.changes]
        last = pages[-1]
        summary = orjson.loads(last.json)
        tables, at = [], 0
        for t in summary["tables"]:
            n = t.pop("changes")
            schema = [SchemaChange(**x) for x in t.pop("schema")]
            tables.append(TableDiff(changes=changes[at : at + n], schema=schema, **t))
            at += n
        return WorldDiff(
            Resolved(WorldRef.parse(a), summary["a"]["name"], last.from_hash, _time(summary["a"]["at"])),
            Resolved(WorldRef.parse(b), summary["b"]["name"], last.to_hash, _time(summary["b"]["at"])),
            tables,
            [SchemaChange(**x) for x in summary["events_schema"]],
        )

    # --- rollback ---------------------------------------------------------------------------------

    def plan_rollback(self, world: str, to: str) -> RollbackPlan:
        return _plan(self._call(lambda: self.client.rollback(world, to, dry_run=True)))

    def rollback(self, world: str, to: str, *, force: bool = False) -> RollbackOutcome:
        resp = self._call(lambda: self.client.rollback(world, to, force=force))
        return RollbackOutcome(_plan(resp), resp.commit_hash or None, resp.attempts)

    # --- merge -----------------------------------------------------------------------------------

    def _merge(self, fn: Callable[[], pb.MergeResponse]) -> Outcome:
        """The outcome; a merge refused on conflicts (ABORTED) answers with the conflicts of its details."""
        try:
            return Outcome.of(fn())
        except grpc.RpcError as exc:
            found = WorldClient.conflicts_of(exc) if exc.code() == grpc.StatusCode.ABORTED else None
            if found is None or not found.json:
                raise WorldsError(f"API {exc.code().name}: {exc.details()}") from exc
            return Outcome.of(found)

    def merge_worlds(
        self, source: str, into: str, strategy: Strategies, *, dry_run: bool = False, message: str | None = None
    ) -> Outcome:
        per_type = strategy.to_json()["per_type"]
        return self._merge(
            lambda: self.client.merge_world(
                source, into, str(strategy.default), strategy_for=per_type, dry_run=dry_run, message=message or ""
            )
        )

    def continue_merge(self, target: str, *, message: str | None = None) -> Outcome:
        return self._merge(lambda: self.client.continue_merge(target, message or ""))

    def abort_merge(self, target: str) -> None:
        self._call(lambda: self.client.abort_merge(target))

    def pending_merge(self, target: str) -> dict[str, Any]:
        """The pending merge document as ``PendingStore.load`` returns it (every page joined)."""
        resp = self._call(lambda: self.client.list_conflicts(target))
        doc: dict[str, Any] = orjson.loads(resp.json) if resp.json else {}
        chosen = doc.pop("resolutions", {})
        return doc | {"conflicts": [orjson.loads(c.json) for c in resp.conflicts], "resolutions": chosen}

    def resolve_conflict(self, target: str, conflict_id: int, take: str) -> dict[str, Any]:
        c = self._call(lambda: self.client.resolve_conflict(target, conflict_id, take))
        return dict(orjson.loads(c.json))
