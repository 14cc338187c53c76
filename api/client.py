"""A small synchronous Python client of the world manager API.

    from api.client import WorldClient
    with WorldClient("127.0.0.1:50051", token="cwy_...") as c:
        c.create_world("whatif-001")
        for commit in c.history("whatif-001", limit=20):
            print(commit.hash, commit.message)

Writes get a fresh idempotency key unless one is given: pass your own key to make a retry safe
(the same key returns the first call's outcome; it never acts twice). Streaming reads follow the
page tokens for you. Errors are ``grpc.RpcError`` with ``.code()`` and ``.details()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

import grpc
from grpc_status import rpc_status

from api import world_manager_pb2 as pb
from api import world_manager_pb2_grpc as pb_grpc
from streams.settings import Settings

_M = TypeVar("_M", pb.MergeResponse, pb.PublishRunResponse)


def _detail(error: grpc.RpcError, kind: type[_M]) -> _M | None:
    """The first message of type ``kind`` in an error's rich status details, or None."""
    status = rpc_status.from_call(error)
    for detail in status.details if status else ():
        out = kind()
        if detail.Unpack(out):
            return out
    return None


class WorldClient:
    def __init__(self, target: str, token: str = "", *, ca_file: str = "", timeout_s: float = 60.0) -> None:
        if ca_file:
            creds = grpc.ssl_channel_credentials(Path(ca_file).read_bytes())
            self.channel = grpc.secure_channel(target, creds)
        else:
            self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.WorldManagerServiceStub(self.channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout_s = timeout_s

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(settings.api_url, settings.api_token.reveal(), ca_file=settings.api_tls_ca)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: Any) -> Any:
        """Call a unary RPC by name with this client's token (used by tests and the CLI)."""
        return getattr(self.stub, method)(request, metadata=self._metadata, timeout=self.timeout_s)

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        """Every page of a streaming RPC; resumes with the last page token if the stream breaks."""
        return getattr(self.stub, method)(request, metadata=self._metadata, timeout=self.timeout_s)

    def pages(self, method: str, request: Callable[[str], Any]) -> Iterator[Any]:
        """Every page of a paged unary RPC: ``request(token)`` builds the call for each page token."""
        token = ""
        while True:
            page = self.call(method, request(token))
            yield page
            token = page.next_page_token
            if not token:
                return

    @staticmethod
    def key(given: str | None) -> str:
        return given or uuid.uuid4().hex

    # --- worlds ----------------------------------------------------------------------------------

    def create_world(self, world_id: str, *, idempotency_key: str | None = None) -> pb.WorldResponse:
        return self.call(
            "CreateWorld", pb.CreateWorldRequest(world_id=world_id, idempotency_key=self.key(idempotency_key))
        )

    def fork_world(
        self,
        source: str,
        new_world: str,
        *,
        release: str = "",
        commit: str = "",
        dry_run: bool = False,
        idempotency_key: str | None = None,
    ) -> pb.WorldResponse:
        """Fork ``source``'s head (empty: prod), its ``release``, or a ``commit`` hash as ``new_world``;
        ``dry_run``: check only (``created`` then says whether a real call would create it)."""
        req = pb.ForkWorldRequest(
            source_world_id=source,
            new_world_id=new_world,
            source_release=release,
            source_commit=commit,
            dry_run=dry_run,
            idempotency_key=self.key(idempotency_key),
        )
        return self.call("ForkWorld", req)

    def get_world(self, world_id: str) -> pb.World:
        return self.call("GetWorld", pb.GetWorldRequest(world_id=world_id)).world

    def list_worlds(self, page_size: int = 0) -> list[pb.World]:
        pages = self.pages("ListWorlds", lambda t: pb.ListWorldsRequest(page_size=page_size, page_token=t))
        return [w for page in pages for w in page.worlds]

    def delete_world(self, world_id: str, *, expected_hash: str = "", idempotency_key: str | None = None) -> bool:
        req = pb.DeleteWorldRequest(
            world_id=world_id, expected_hash=expected_hash, idempotency_key=self.key(idempotency_key)
        )
        return bool(self.call("DeleteWorld", req).deleted)

    # --- releases, history, diff, audit, time travel ---------------------------------------------

    def create_release(
        self, world_id: str, name: str, description: str = "", *, idempotency_key: str | None = None
    ) -> pb.ReleaseResponse:
        req = pb.CreateReleaseRequest(
            world_id=world_id, release_name=name, description=description, idempotency_key=self.key(idempotency_key)
        )
        return self.call("CreateRelease", req)

    def list_releases(self, world_id: str = "", page_size: int = 0) -> list[pb.Release]:
        pages = self.pages(
            "ListReleases", lambda t: pb.ListReleasesRequest(world_id=world_id, page_size=page_size, page_token=t)
        )
        return [r for page in pages for r in page.releases]

    def delete_release(
        self, world_id: str, name: str, *, idempotency_key: str | None = None
    ) -> pb.DeleteReleaseResponse:
        """Delete a release (admin); ``deleted`` is false if there was none."""
        req = pb.DeleteReleaseRequest(world_id=world_id, release_name=name, idempotency_key=self.key(idempotency_key))
        return self.call("DeleteRelease", req)

    def history(
        self,
        world_id: str,
        *,
        limit: int = 0,
        page_size: int = 0,
        page_token: str = "",
        since: str = "",
        until: str = "",
        author: str = "",
        changes: bool = False,
        no_counts: bool = False,
    ) -> Iterator[pb.Commit]:
        req = pb.CommitHistoryRequest(
            world_id=world_id,
            limit=limit,
            page_size=page_size,
            page_token=page_token,
            since=since,
            until=until,
            author=author,
            changes=changes,
            no_counts=no_counts,
        )
        for page in self.stream("GetCommitHistory", req):
            yield from page.commits

    def diff(self, from_ref: str, to_ref: str, page_size: int = 0) -> Iterator[pb.EntityChange]:
        for page in self.stream("GetDiff", pb.DiffRequest(from_ref=from_ref, to_ref=to_ref, page_size=page_size)):
            yield from page.changes

    def audit(self, ref: str, entity_type: str, pk: str, kind: str = "object") -> Iterator[pb.AuditEntry]:
        req = pb.EntityAuditRequest(ref=ref, entity_type=entity_type, pk=pk, kind=kind)
        for page in self.stream("GetEntityAudit", req):
            yield from page.entries

    def query_at(
        self, ref: str, entity_type: str = "", pk: str = "", page_size: int = 0
    ) -> Iterator[pb.QueryAtResponse]:
        req = pb.QueryAtRequest(ref=ref, entity_type=entity_type, pk=pk, page_size=page_size)
        yield from self.stream("QueryAt", req)

    # --- rewind, direct writes -------------------------------------------------------------------

    def rollback(
        self,
        world_id: str,
        to_ref: str,
        *,
        expected_hash: str = "",
        force: bool = False,
        dry_run: bool = False,
        idempotency_key: str | None = None,
    ) -> pb.RollbackResponse:
        req = pb.RollbackRequest(
            world_id=world_id,
            to_ref=to_ref,
            expected_hash=expected_hash,
            force=force,
            dry_run=dry_run,
            idempotency_key=self.key(idempotency_key),
        )
        return self.call("Rollback", req)

    def apply_changes(
        self, world_id: str, events_json: list[str], *, deadline_ms: int = 0, idempotency_key: str | None = None
    ) -> pb.ApplyChangesResponse:
        req = pb.ApplyChangesRequest(
            world_id=world_id,
            events_json=events_json,
            deadline_ms=deadline_ms,
            idempotency_key=self.key(idempotency_key),
        )
        return self.call("ApplyChanges", req)

    # --- merge -----------------------------------------------------------------------------------

    def merge_world(
        self,
        source: str,
        target: str,
        strategy: str = "NORMAL",
        *,
        strategy_for: dict[str, str] | None = None,
        dry_run: bool = False,
        message: str = "",
        idempotency_key: str | None = None,
    ) -> pb.MergeResponse:
        """Merge ``source`` into ``target``; conflicts under NORMAL raise ABORTED (see :meth:`conflicts_of`)."""
        req = pb.MergeWorldRequest(
            source_world_id=source,
            target_world_id=target,
            strategy=pb.MergeStrategy.Value(strategy) if strategy in pb.MergeStrategy.keys() else pb.NORMAL,
            strategy_name="" if strategy in pb.MergeStrategy.keys() else strategy,
            strategy_for=strategy_for or {},
            dry_run=dry_run,
            message=message,
            idempotency_key=self.key(idempotency_key),
        )
        return self.call("MergeWorld", req)

    @staticmethod
    def conflicts_of(error: grpc.RpcError) -> pb.MergeResponse | None:
        """The conflicts an ABORTED merge carries in its rich status details, or None."""
        return _detail(error, pb.MergeResponse)

    def list_conflicts(self, target: str, page_size: int = 0) -> pb.ListConflictsResponse:
        """The pending merge into ``target`` with every conflict (the pages joined into one response)."""
        token = ""
        out: pb.ListConflictsResponse | None = None
        while True:
            page = self.conflicts_page(target, page_size=page_size, page_token=token)
            if out is None:
                out = page
            else:
                out.conflicts.extend(page.conflicts)
            token = page.next_page_token
            if not token:
                out.next_page_token = ""
                return out

    def conflicts_page(self, target: str, *, page_size: int = 0, page_token: str = "") -> pb.ListConflictsResponse:
        req = pb.ListConflictsRequest(target_world_id=target, page_size=page_size, page_token=page_token)
        return self.call("ListConflicts", req)

    def resolve_conflict(
        self, target: str, conflict_id: int, take: str, *, idempotency_key: str | None = None
    ) -> pb.MergeConflict:
        req = pb.ResolveConflictRequest(
            target_world_id=target, conflict_id=conflict_id, take=take, idempotency_key=self.key(idempotency_key)
        )
        return self.call("ResolveConflict", req).conflict

    def continue_merge(self, target: str, message: str = "", *, idempotency_key: str | None = None) -> pb.MergeResponse:
        req = pb.ContinueMergeRequest(
            target_world_id=target, message=message, idempotency_key=self.key(idempotency_key)
        )
        return self.call("ContinueMerge", req)

    def abort_merge(self, target: str, *, idempotency_key: str | None = None) -> bool:
        req = pb.AbortMergeRequest(target_world_id=target, idempotency_key=self.key(idempotency_key))
        return bool(self.call("AbortMerge", req).aborted)

    # --- Write-Audit-Publish ---------------------------------------------------------------------

    def publish_audit(
        self,
        source: str,
        target: str = "",
        *,
        max_drift: int | None = None,
        max_tables: int | None = None,
        max_changed_entities: int | None = None,
        idempotency_key: str | None = None,
    ) -> pb.PublishAuditResponse:
        """Audit ``source`` against ``target`` (empty: prod); limits left None are the server's settings."""
        req = pb.PublishAuditRequest(
            source_world_id=source,
            target_world_id=target,
            max_drift=max_drift,
            max_tables=max_tables,
            max_changed_entities=max_changed_entities,
            idempotency_key=self.key(idempotency_key),
        )
        return self.call("PublishAudit", req)

    def publish_approve(
        self, plan_id: str, target: str = "", *, decline: bool = False, idempotency_key: str | None = None
    ) -> pb.PublishApproveResponse:
        req = pb.PublishApproveRequest(
            plan_id=plan_id, target_world_id=target, decline=decline, idempotency_key=self.key(idempotency_key)
        )
        return self.call("PublishApprove", req)

    def publish_run(
        self,
        plan_id: str,
        target: str = "",
        *,
        strategy: str = "",
        keep_source: bool = False,
        dry_run: bool = False,
        idempotency_key: str | None = None,
    ) -> pb.PublishRunResponse:
        req = pb.PublishRunRequest(
            plan_id=plan_id,
            target_world_id=target,
            strategy=strategy,
            keep_source=keep_source,
            dry_run=dry_run,
            idempotency_key=self.key(idempotency_key),
        )
        return self.call("PublishRun", req)

    def publish_status(self, page_size: int = 0) -> list[pb.PublishBranchState]:
        """The gate's state per source world (every page)."""
        pages = self.pages("PublishStatus", lambda t: pb.PublishStatusRequest(page_size=page_size, page_token=t))
        return [st for page in pages for st in page.states]

    def publish_log(self, plan_id: str = "", page_size: int = 0) -> list[str]:
        """The publish log's entries as JSON, oldest first: one plan's (or every entry), every page."""
        pages = self.pages(
            "ListPublishLog", lambda t: pb.ListPublishLogRequest(plan_id=plan_id, page_size=page_size, page_token=t)
        )
        return [e for page in pages for e in page.entries_json]

    @staticmethod
    def run_of(error: grpc.RpcError) -> pb.PublishRunResponse | None:
        """The run outcome a refused (FAILED_PRECONDITION) or failed (INTERNAL) PublishRun carries, or None."""
        return _detail(error, pb.PublishRunResponse)
