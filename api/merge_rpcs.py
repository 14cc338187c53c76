"""The merge RPCs of the world manager service: MergeWorld and the pending MANUAL merge.

They call the three-way merge's Python API (``Worlds.merge_worlds``, ``pending_merge``,
``resolve_conflict``, ``continue_merge``, ``abort_merge``) in a worker thread, through the
servicer's one path (auth, idempotency key, audit log; see :mod:`api.service`).

A merge that meets conflicts and writes nothing (NORMAL, or any strategy on a schema conflict) is
refused with ``ABORTED``; its conflicts travel in the gRPC rich error model: the trailer
``grpc-status-details-bin`` holds a ``google.rpc.Status`` whose one detail is a packed
:class:`MergeResponse` (status ``conflicts``, the conflicts without their state JSON, capped so the
trailer stays under gRPC's 8 KiB metadata limit). ``MergeWorld`` with ``dry_run`` answers OK with
every conflict and its states. A MANUAL merge that meets conflicts answers OK with status
``pending``: the conflicts are stored and numbered for ``ResolveConflict`` / ``ContinueMerge``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc
import orjson
from google.protobuf import any_pb2
from google.rpc import status_pb2

from api import paging
from api import world_manager_pb2 as pb
from api.errors import HeadMoved, InvalidRequest, MergeConflicts
from worlds.merge_run import MergeOutcome, _rkey

#: Bytes of the conflicts put in an ABORTED status's details (gRPC refuses metadata over 8 KiB).
DETAILS_BUDGET = 6000


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def conflict_message(c: Mapping[str, Any], *, cid: int = 0, resolution: str = "") -> pb.MergeConflict:
    """A conflict as ``Conflict.to_json`` (or the pending store) writes it, as a message."""
    if "table" in c:  # a schema conflict: {table, column, detail}
        return pb.MergeConflict(conflict="SCHEMA", entity_type=c["table"], pk=c.get("column", ""), json=_json(c))
    return pb.MergeConflict(
        id=int(c.get("id", cid)),
        kind=c.get("kind", ""),
        entity_type=c.get("type", ""),
        pk=c.get("pk", ""),
        conflict=c.get("conflict", ""),
        resolution=resolution,
        json=_json(c),
    )


def merge_response(out: MergeOutcome) -> pb.MergeResponse:
    """The outcome as a message; conflicts are numbered (1, 2, ...) as the pending store numbers them."""
    pending = out.status == "pending"
    conflicts = [conflict_message(c.to_json(), cid=i + 1 if pending else 0) for i, c in enumerate(out.result.conflicts)]
    conflicts += [conflict_message(s) for s in out.schema]
    doc = {k: v for k, v in out.to_json().items() if k != "conflict_list"}
    return pb.MergeResponse(
        status=out.status,
        commit_hash=out.committed or "",
        conflicts=conflicts,
        source_hash=out.source_hash,
        target_head=out.target_head,
        base=out.base,
        json=_json(doc),
    )


def conflict_status(message: str, resp: pb.MergeResponse) -> tuple[str, bytes]:
    """The ABORTED message and its ``google.rpc.Status`` details (as many conflicts as the budget holds)."""
    slim = pb.MergeResponse(
        status=resp.status,
        source_hash=resp.source_hash,
        target_head=resp.target_head,
        base=resp.base,
    )
    if len(resp.json) < DETAILS_BUDGET // 3:  # the outcome's counts, so a client can print the whole summary
        slim.json = resp.json
    for c in resp.conflicts:
        doc = orjson.loads(c.json)  # the conflict without its three states
        brief = {k: doc[k] for k in ("kind", "type", "pk", "conflict", "fields", "endpoints", "link_side") if k in doc}
        item = pb.MergeConflict(
            id=c.id, kind=c.kind, entity_type=c.entity_type, pk=c.pk, conflict=c.conflict, json=_json(brief)
        )
        if slim.ByteSize() + item.ByteSize() + 8 > DETAILS_BUDGET:
            break
        slim.conflicts.append(item)
    shown, total = len(slim.conflicts), len(resp.conflicts)
    if shown < total:
        message += f" (the details hold the first {shown} of {total}; MergeWorld with dry_run lists them all)"
    packed = any_pb2.Any()
    packed.Pack(slim)
    status = status_pb2.Status(code=grpc.StatusCode.ABORTED.value[0], message=message, details=[packed])
    return message, status.SerializeToString()


def answer(out: MergeOutcome) -> pb.MergeResponse:
    """The response, or ABORTED with the conflicts when the merge met conflicts and wrote nothing."""
    resp = merge_response(out)
    if out.status == "conflicts" and not out.dry_run:
        n = len(resp.conflicts)
        text = (
            f"merge of world {out.source!r} into {out.target!r} met {n} conflict{'s' if n != 1 else ''} under "
            f"{out.strategies.default}: nothing was written; the conflicts are in the status details "
            "(or merge with strategy MANUAL and resolve them)"
        )
        message, details = conflict_status(text, resp)
        raise MergeConflicts(message, details)
    return resp


def pending_response(doc: Mapping[str, Any], size: int = 0, token: str = "") -> pb.ListConflictsResponse:
    """One page of the pending merge ``doc``'s conflicts (ordered by id).

    The token pins the pending merge it was issued for (its ``created`` stamp and heads): if that
    merge was aborted or replaced since, the next page is refused (FAILED_PRECONDITION), never mixed.
    """
    chosen = doc.get("resolutions", {})
    size = paging.page_size(size)
    pin = f"{doc.get('created', '')}|{doc['source_hash']}|{doc['target_head']}"
    state = paging.decode(token, "conflicts") or {}
    if state and state.get("pin") != pin:
        raise HeadMoved(f"the pending merge into {doc['target']!r} changed since the first page: list it again")
    ordered = sorted(doc["conflicts"], key=lambda c: int(c["id"]))
    start = int(state.get("after", 0))
    rest = [c for c in ordered if int(c["id"]) > start]
    page = rest[:size]
    more = len(rest) > size
    return pb.ListConflictsResponse(
        source_world_id=doc["source"],
        target_world_id=doc["target"],
        source_hash=doc["source_hash"],
        target_head=doc["target_head"],
        base=doc["base"],
        conflicts=[conflict_message(c, resolution=chosen.get(_rkey(c), "")) for c in page],
        next_page_token=paging.encode("conflicts", pin=pin, after=int(page[-1]["id"])) if more else "",
        total=len(ordered),
        json=_json({k: v for k, v in doc.items() if k != "conflicts"}),
    )


class MergeRpcs:
    """Mixin of :class:`api.service.WorldService`: the merge RPCs."""

    if TYPE_CHECKING:
        _write: Callable[..., Awaitable[Any]]
        _read: Callable[..., Awaitable[Any]]
        _blocking: Callable[[Callable[[Any], Any]], Awaitable[Any]]

    async def MergeWorld(self, request: pb.MergeWorldRequest, context: Any) -> pb.MergeResponse:  # noqa: N802
        async def act() -> pb.MergeResponse:
            strategy = request.strategy_name or pb.MergeStrategy.Name(request.strategy)
            out = await self._blocking(
                lambda w: w.merge_worlds(
                    request.source_world_id,
                    request.target_world_id,
                    strategy,
                    strategy_for=dict(request.strategy_for) or None,
                    dry_run=request.dry_run,
                    message=request.message or None,
                )
            )
            return answer(out)

        return await self._write("MergeWorld", request.target_world_id, request, context, pb.MergeResponse, act)

    async def ListConflicts(self, request: pb.ListConflictsRequest, context: Any) -> pb.ListConflictsResponse:  # noqa: N802
        async def act() -> pb.ListConflictsResponse:
            doc = await self._blocking(lambda w: _pending(w, request.target_world_id))
            return pending_response(doc, request.page_size, request.page_token)

        return await self._read("ListConflicts", request.target_world_id, context, act)

    async def ResolveConflict(self, request: pb.ResolveConflictRequest, context: Any) -> pb.ResolveConflictResponse:  # noqa: N802
        async def act() -> pb.ResolveConflictResponse:
            take = request.take
            if take not in ("source", "target") and not take.startswith("value="):
                raise InvalidRequest("take wants source, target or value=JSON")
            if request.conflict_id <= 0:
                raise InvalidRequest("conflict_id wants the id ListConflicts shows (1, 2, ...)")
            c = await self._blocking(
                lambda w: w.resolve_conflict(_checked(w, request.target_world_id), request.conflict_id, take)
            )
            return pb.ResolveConflictResponse(conflict=conflict_message(c, resolution=take))

        return await self._write(
            "ResolveConflict", request.target_world_id, request, context, pb.ResolveConflictResponse, act
        )

    async def ContinueMerge(self, request: pb.ContinueMergeRequest, context: Any) -> pb.MergeResponse:  # noqa: N802
        async def act() -> pb.MergeResponse:
            out = await self._blocking(
                lambda w: w.continue_merge(_checked(w, request.target_world_id), message=request.message or None)
            )
            return answer(out)

        return await self._write("ContinueMerge", request.target_world_id, request, context, pb.MergeResponse, act)

    async def AbortMerge(self, request: pb.AbortMergeRequest, context: Any) -> pb.AbortMergeResponse:  # noqa: N802
        async def act() -> pb.AbortMergeResponse:
            await self._blocking(lambda w: w.abort_merge(_checked(w, request.target_world_id)))
            return pb.AbortMergeResponse(aborted=True)

        return await self._write("AbortMerge", request.target_world_id, request, context, pb.AbortMergeResponse, act)


def _checked(w: Any, world: str) -> str:
    """``world`` after checking it is a valid world id (the pending store names files after it)."""
    w.branch(world)
    return world


def _pending(w: Any, world: str) -> dict[str, Any]:
    return w.pending_merge(_checked(w, world))
