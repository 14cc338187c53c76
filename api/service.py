"""The WorldManagerService servicer: authenticate, authorize, run (idempotently for writes), map errors.

Every call follows one path (:meth:`WorldService._call`): the bearer token is checked, the role is
checked against the method and the target world id taken from the request (no lookup, so a refusal
never tells whether a world exists), then the action runs. A mutating call runs through the
idempotent executor under the caller's idempotency key and is written to the audit log.

Reads use ``worlds.api.Worlds`` (blocking: pyiceberg) in worker threads, one instance per thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import grpc
import orjson
from google.protobuf.message import Message

from api import paging
from api import world_manager_pb2 as pb
from api import world_manager_pb2_grpc as pb_grpc
from api.audit_log import AuditLog
from api.auth import Principal, authenticate, authorize, bearer
from api.errors import ApiError, HeadMoved, InvalidRequest, NotFound, status_for
from api.idempotency import IdempotentExecutor, fingerprint
from api.merge_rpcs import MergeRpcs
from api.publish_rpcs import PublishRpcs
from api.release_rpcs import ReleaseRpcs
from models.worlds import WorldNaming
from sinks.nessie import NessieClient
from streams.settings import Settings
from worlds.api import Worlds
from worlds.manager import ForkSource, World, WorldManager
from worlds.refs import WorldRef, parse_time, release_tag

M = TypeVar("M", bound=Message)
HASH = re.compile(r"[0-9a-fA-F]{8,64}")
STATUS_DETAILS = "grpc-status-details-bin"  # the gRPC rich error model's trailer (google.rpc.Status)


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def _world(w: World) -> pb.World:
    return pb.World(world_id=w.world_id, branch=w.branch, head_hash=w.hash)


def _time(text: str) -> datetime | None:
    return parse_time(text) if text else None


class WorldService(MergeRpcs, PublishRpcs, ReleaseRpcs, pb_grpc.WorldManagerServiceServicer):
    def __init__(
        self,
        settings: Settings,
        nessie: NessieClient,
        executor: IdempotentExecutor,
        tokens: dict[str, Principal],
        audit: AuditLog,
        apply_changes: Callable[[pb.ApplyChangesRequest], Awaitable[pb.ApplyChangesResponse]] | None = None,
    ) -> None:
        self.settings = settings
        self.naming = WorldNaming(settings.prod_world, settings.main_branch)
        self.manager = WorldManager(nessie, self.naming)
        self.executor = executor
        self.tokens = tokens
        self.audit = audit
        self.apply_changes = apply_changes
        self._local = threading.local()

    # --- plumbing --------------------------------------------------------------------------------

    def _worlds(self) -> Worlds:
        w = getattr(self._local, "worlds", None)
        if w is None:
            w = self._local.worlds = Worlds(self.settings)
        return w

    async def _blocking(self, fn: Callable[[Worlds], Any]) -> Any:
        return await asyncio.to_thread(lambda: fn(self._worlds()))

    def _principal(self, context: grpc.aio.ServicerContext, method: str, world: str | None) -> Principal:
        principal = authenticate(self.tokens, bearer(context.invocation_metadata()))
        authorize(principal, method, world or None, self.settings.prod_world)
        return principal

    def _who(self, context: grpc.aio.ServicerContext) -> str:
        """The caller's token name for the audit log ("-" without a valid token)."""
        try:
            return authenticate(self.tokens, bearer(context.invocation_metadata())).name
        except ApiError:
            return "-"

    async def _read(
        self, method: str, world: str | None, context: grpc.aio.ServicerContext, action: Callable[[], Awaitable[M]]
    ) -> M:
        try:
            self._principal(context, method, world)
            return await action()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status
            code, message = status_for(exc)
        await context.abort(code, message)
        raise AssertionError("unreachable")

    async def _write(
        self,
        method: str,
        world: str | None,
        request: Message,
        context: grpc.aio.ServicerContext,
        response_type: type[M],
        action: Callable[[], Awaitable[M]],
    ) -> M:
        key = getattr(request, "idempotency_key", "")
        who = self._who(context)
        details = b""  # rich error details (google.rpc.Status) of a refusal, e.g. a merge's conflicts
        try:
            self._principal(context, method, world)
            if not key:
                raise InvalidRequest(f"{method} needs an idempotency_key (any unique string, e.g. a UUID)")
            if len(key) > 200:
                raise InvalidRequest("idempotency_key is longer than 200 characters")
            bare = type(request)()
            bare.CopyFrom(request)
            bare.ClearField("idempotency_key")
            fp = fingerprint(method, bare.SerializeToString(deterministic=True))

            async def run() -> bytes:
                return (await action()).SerializeToString()

            outcome = await self.executor.run(who, key, fp, run)
            code, message, replayed = outcome.code, outcome.message, outcome.replayed
            if code != grpc.StatusCode.OK:
                details = outcome.response
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status
            (code, message), replayed = status_for(exc), False
            details = exc.status_details if isinstance(exc, ApiError) else b""
        self.audit.write(who, method, world, key, code.name, message, replayed)
        if code != grpc.StatusCode.OK:
            await context.abort(code, message, trailing_metadata=((STATUS_DETAILS, details),) if details else ())
        return response_type.FromString(outcome.response)

    async def _stream(
        self,
        method: str,
        world: str | None,
        context: grpc.aio.ServicerContext,
        pages: Callable[[Worlds], Iterator[M]],
    ) -> AsyncIterator[M]:
        """Run a blocking page generator in a thread and stream its pages as they come.

        At most a few pages wait in memory; if the client goes away the thread stops at its next page.
        """
        try:
            self._principal(context, method, world)
            queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=4)
            loop = asyncio.get_running_loop()
            done, stop = object(), threading.Event()

            def produce() -> None:
                def put(item: Any) -> None:
                    asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()

                try:
                    for page in pages(self._worlds()):
                        if stop.is_set():
                            return
                        put(page)
                    put(done)
                except BaseException as exc:  # noqa: BLE001 - handed to the stream
                    if not stop.is_set():
                        put(exc)

            producer = loop.run_in_executor(None, produce)
            try:
                while (item := await queue.get()) is not done:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
            finally:
                stop.set()
                while not queue.empty():  # free a producer blocked on a full queue
                    queue.get_nowait()
            await producer
            return
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status
            code, message = status_for(exc)
        await context.abort(code, message)

    # --- worlds ----------------------------------------------------------------------------------

    async def CreateWorld(self, request: pb.CreateWorldRequest, context: Any) -> pb.WorldResponse:  # noqa: N802
        async def act() -> pb.WorldResponse:
            world, created = await self.manager.create(request.world_id, ForkSource())
            return pb.WorldResponse(world=_world(world), created=created)

        return await self._write("CreateWorld", request.world_id, request, context, pb.WorldResponse, act)

    async def ForkWorld(self, request: pb.ForkWorldRequest, context: Any) -> pb.WorldResponse:  # noqa: N802
        async def act() -> pb.WorldResponse:
            source = self._fork_source(request)
            if request.dry_run:  # every check a fork makes, nothing written
                existing, at = await self.manager.plan_create(request.new_world_id, source)
                if existing is not None:
                    return pb.WorldResponse(world=_world(existing), created=False)
                branch = self.naming.branch(request.new_world_id)
                return pb.WorldResponse(world=_world(World(request.new_world_id, branch, at.hash)), created=True)
            world, created = await self.manager.create(request.new_world_id, source)
            return pb.WorldResponse(world=_world(world), created=created)

        return await self._write("ForkWorld", request.new_world_id, request, context, pb.WorldResponse, act)

    def _fork_source(self, request: pb.ForkWorldRequest) -> ForkSource:
        if request.source_commit:
            if request.source_release:
                raise InvalidRequest("give source_release or source_commit, not both")
            if not HASH.fullmatch(request.source_commit):
                raise InvalidRequest(f"source_commit {request.source_commit!r} is not a commit hash (hex digits)")
            return ForkSource(commit=request.source_commit)
        src = request.source_world_id or self.settings.prod_world
        self.naming.branch(src)
        if request.source_release:
            return ForkSource(tag=release_tag(src, request.source_release))
        return ForkSource(world=src)

    async def GetWorld(self, request: pb.GetWorldRequest, context: Any) -> pb.WorldResponse:  # noqa: N802
        async def act() -> pb.WorldResponse:
            world = await self.manager.get(request.world_id)
            if world is None:
                raise NotFound(f"world {request.world_id!r} does not exist")
            return pb.WorldResponse(world=_world(world))

        return await self._read("GetWorld", request.world_id, context, act)

    async def ListWorlds(self, request: pb.ListWorldsRequest, context: Any) -> pb.ListWorldsResponse:  # noqa: N802
        async def act() -> pb.ListWorldsResponse:
            size = paging.page_size(request.page_size)
            state = paging.decode(request.page_token, "worlds") or {}
            rest = paging.after(await self.manager.list(), lambda w: w.world_id, state.get("after"))
            page = rest[:size]
            token = paging.encode("worlds", after=page[-1].world_id) if len(rest) > size else ""
            return pb.ListWorldsResponse(worlds=[_world(w) for w in page], next_page_token=token)

        return await self._read("ListWorlds", None, context, act)

    async def DeleteWorld(self, request: pb.DeleteWorldRequest, context: Any) -> pb.DeleteWorldResponse:  # noqa: N802
        async def act() -> pb.DeleteWorldResponse:
            if request.expected_hash:
                world = await self.manager.get(request.world_id)
                if world is not None and world.hash != request.expected_hash:
                    raise HeadMoved(
                        f"world {request.world_id!r} is at {world.hash[:16]}, not {request.expected_hash[:16]}"
                    )
            deleted = await self.manager.delete(request.world_id, request.expected_hash or None)
            return pb.DeleteWorldResponse(deleted=deleted)

        return await self._write("DeleteWorld", request.world_id, request, context, pb.DeleteWorldResponse, act)

    # --- history, diff, audit, time travel (server streaming) ------------------------------------

    async def GetCommitHistory(
        self, request: pb.CommitHistoryRequest, context: Any
    ) -> AsyncIterator[pb.CommitHistoryResponse]:  # noqa: N802
        def pages(w: Worlds) -> Iterator[pb.CommitHistoryResponse]:
            size = paging.page_size(request.page_size)
            state = paging.decode(request.page_token, "history") or {}
            resume_after, seen = state.get("after"), int(state.get("seen", 0))
            until = parse_time(state["until"]) if state.get("until") else _time(request.until)
            limit = request.limit - seen if request.limit else None
            if limit is not None and limit <= 0:
                return
            records = w.history(
                request.world_id,
                since=_time(request.since),
                until=until,
                author=request.author or None,
                limit=None if resume_after else limit,
                counts=not request.no_counts,
                changes=request.changes,
                page_size=size,
            )
            if resume_after:  # skip the commits (of the resume time) up to and including the last one sent
                records = _skip_through(records, lambda r: r.hash, resume_after)
            sent = 0
            for chunk in paging.chunks(records, size):
                if limit is not None:
                    chunk = chunk[: limit - sent]
                sent += len(chunk)
                last = chunk[-1]
                more = limit is None or sent < limit
                token = (
                    paging.encode("history", after=last.hash, until=last.time.isoformat(), seen=seen + sent)
                    if more
                    else ""
                )
                yield pb.CommitHistoryResponse(commits=[_commit(r) for r in chunk], next_page_token=token)
                if not more:
                    return

        async for page in self._stream("GetCommitHistory", request.world_id, context, pages):
            yield page

    async def GetDiff(self, request: pb.DiffRequest, context: Any) -> AsyncIterator[pb.DiffResponse]:  # noqa: N802
        def pages(w: Worlds) -> Iterator[pb.DiffResponse]:
            size = paging.page_size(request.page_size)
            state = paging.decode(request.page_token, "diff")
            if state is None:  # each ref resolved once; its name (a tag for WORLD/RELEASE) and time kept
                ra, rb = w.resolve(request.from_ref), w.resolve(request.to_ref)
                state = {"a": _pinned(ra), "b": _pinned(rb), "off": 0, "refs": [_named(ra), _named(rb)]}
            a, b, offset = state["a"], state["b"], int(state["off"])
            diff = w.diff(a, b)
            changes = diff.changes
            for start in range(offset, max(len(changes), offset + 1), size):
                chunk = changes[start : start + size]
                more = start + size < len(changes)
                token = paging.encode("diff", a=a, b=b, off=start + size, refs=state.get("refs")) if more else ""
                yield pb.DiffResponse(
                    json="" if more else _json(_diff_summary(diff, state.get("refs"))),
                    from_hash=diff.a.hash,
                    to_hash=diff.b.hash,
                    changes=[
                        pb.EntityChange(
                            kind=c.kind, entity_type=c.entity_type, pk=c.pk, change=c.change, json=_json(c.to_json())
                        )
                        for c in chunk
                    ],
                    next_page_token=token,
                )

        world = request.from_ref.partition("@")[0].partition("/")[0]
        async for page in self._stream("GetDiff", world, context, pages):
            yield page

    async def GetEntityAudit(
        self, request: pb.EntityAuditRequest, context: Any
    ) -> AsyncIterator[pb.EntityAuditResponse]:  # noqa: N802
        def pages(w: Worlds) -> Iterator[pb.EntityAuditResponse]:
            size = paging.page_size(request.page_size)
            state = paging.decode(request.page_token, "audit")
            ref = state["ref"] if state else _pin(w, request.ref)
            offset = int(state["off"]) if state else 0
            if not request.entity_type or not request.pk:
                raise InvalidRequest("GetEntityAudit needs entity_type and pk")
            entries = w.audit(
                ref,
                request.entity_type,
                request.pk,
                kind=request.kind or "object",
                since=_time(request.since),
                until=_time(request.until),
            )
            hash_ = ref.partition("@")[2]
            for start in range(offset, max(len(entries), offset + 1), size):
                chunk = entries[start : start + size]
                token = paging.encode("audit", ref=ref, off=start + size) if start + size < len(entries) else ""
                yield pb.EntityAuditResponse(
                    hash=hash_,
                    entries=[
                        pb.AuditEntry(
                            event_id=e.event_id,
                            change_type=e.change_type,
                            version=e.version,
                            commit_hash=e.commit_hash or "",
                            json=_json(e.to_json()),
                        )
                        for e in chunk
                    ],
                    next_page_token=token,
                )

        async for page in self._stream(
            "GetEntityAudit", request.ref.partition("@")[0].partition("/")[0], context, pages
        ):
            yield page

    async def QueryAt(self, request: pb.QueryAtRequest, context: Any) -> AsyncIterator[pb.QueryAtResponse]:  # noqa: N802
        def pages(w: Worlds) -> Iterator[pb.QueryAtResponse]:
            size = paging.page_size(request.page_size)
            state = paging.decode(request.page_token, "query")
            if state is None:  # resolved once; its name (a tag for WORLD/RELEASE) and time travel in the token
                first = w.resolve(request.ref)
                when = first.commit_time.isoformat() if first.commit_time else ""
                pinned = str(WorldRef(first.ref.world, hash=first.hash))
                state = {"ref": pinned, "off": 0, "name": first.name, "at": when}
            ref, offset = state["ref"], int(state["off"])
            pin = {"name": state.get("name", ""), "at": state.get("at", "")}
            snap = w.show(
                ref,
                entity_type=request.entity_type or None,
                pk=request.pk or None,
                include_deleted=request.include_deleted,
            )
            rows = [("o", r) for r in snap.objects.to_pylist()] + [("l", r) for r in snap.links.to_pylist()]
            for start in range(offset, max(len(rows), offset + 1), size):
                chunk = rows[start : start + size]
                more = start + size < len(rows)
                token = paging.encode("query", ref=ref, off=start + size, **pin) if more else ""
                yield pb.QueryAtResponse(
                    hash=snap.resolved.hash,
                    resolved_name=pin["name"],
                    commit_time=pin["at"],
                    objects_json=[_json(r) for k, r in chunk if k == "o"],
                    links_json=[_json(r) for k, r in chunk if k == "l"],
                    next_page_token=token,
                )

        async for page in self._stream("QueryAt", request.ref.partition("@")[0].partition("/")[0], context, pages):
            yield page

    # --- rewind and direct writes ----------------------------------------------------------------

    async def Rollback(self, request: pb.RollbackRequest, context: Any) -> pb.RollbackResponse:  # noqa: N802
        def act_blocking(w: Worlds) -> pb.RollbackResponse:
            if request.expected_hash:
                head = w.head(request.world_id)
                if head.hash != request.expected_hash:
                    raise HeadMoved(
                        f"world {request.world_id!r} is at {head.hash[:16]}, not {request.expected_hash[:16]}"
                    )
            if request.dry_run:
                plan, commit, attempts = w.plan_rollback(request.world_id, request.to_ref), None, 0
            else:
                out = w.rollback(request.world_id, request.to_ref, force=request.force)
                plan, commit, attempts = out.plan, out.hash, out.attempts
            return pb.RollbackResponse(
                commit_hash=commit or "",
                noop=plan.noop if request.dry_run else commit is None,
                rolled_back_commits=len(plan.rolled_back),
                target_hash=plan.target,
                json=_json(dataclasses.asdict(plan)),
                attempts=attempts,
            )

        async def act() -> pb.RollbackResponse:
            return await self._blocking(act_blocking)

        return await self._write("Rollback", request.world_id, request, context, pb.RollbackResponse, act)

    async def ApplyChanges(self, request: pb.ApplyChangesRequest, context: Any) -> pb.ApplyChangesResponse:  # noqa: N802
        async def act() -> pb.ApplyChangesResponse:
            if self.apply_changes is None:
                raise ApiError("ApplyChanges is not configured on this server")
            return await self.apply_changes(request)

        return await self._write("ApplyChanges", request.world_id, request, context, pb.ApplyChangesResponse, act)


def _pinned(r: Any) -> str:
    return str(WorldRef(r.ref.world, hash=r.hash))


def _named(r: Any) -> dict[str, str]:
    return {"name": r.name, "at": r.commit_time.isoformat() if r.commit_time else ""}


def _diff_summary(diff: Any, refs: list[dict[str, str]] | None) -> dict[str, Any]:
    """What the last diff page adds to the changes: enough for a client to print ``worlds diff``."""
    return {
        "a": refs[0] if refs else {},
        "b": refs[1] if refs else {},
        "tables": [
            {
                "table": t.table,
                "changes": len(t.changes),
                "schema": [dataclasses.asdict(x) for x in t.schema],
                "data_files_read": t.data_files_read,
                "data_files_skipped": t.data_files_skipped,
                "delete_files_read": t.delete_files_read,
                "bytes_read": t.bytes_read,
                "rows_read": t.rows_read,
            }
            for t in diff.tables
        ],
        "events_schema": [dataclasses.asdict(x) for x in diff.events_schema],
    }


def _pin(w: Worlds, ref: str) -> str:
    """``ref`` resolved once to ``WORLD@HASH``, so every page reads the same commit."""
    return _pinned(w.resolve(ref))


def _skip_through(items: Iterator[Any], key: Callable[[Any], str], last: str) -> Iterator[Any]:
    buffered = []
    for item in items:
        buffered.append(item)
        if key(item) == last:
            yield from items
            return
    yield from buffered  # the last commit sent is gone (rolled back?): resend from the resume time


def _commit(r: Any) -> pb.Commit:
    return pb.Commit(
        hash=r.hash,
        time=r.time.isoformat(),
        author=r.author,
        message=r.message,
        kind=r.kind,
        event_count=-1 if r.event_count is None else r.event_count,
        json=_json(r.to_json()),
    )
