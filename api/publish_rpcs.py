"""The Write-Audit-Publish RPCs of the world manager service: PublishAudit, PublishApprove, PublishRun.

They call the gate's Python API (``worlds.publish_run.Publisher`` over the server's ``Worlds``) in a
worker thread through the servicer's one path (auth, idempotency key, audit log). The approver and
the runner recorded in the publish log are the caller's token name.

Roles: ``PublishAudit`` is checked against the source world (an audit writes only the publish log,
so an operator may audit a world against prod); ``PublishApprove`` and ``PublishRun`` against the
plan's target, which the request names (empty: the production world), so approving or publishing
into prod needs ``admin``. A plan whose target is not the named one is NOT_FOUND.

A run the gate refuses (not approved, blocked, declined, a head moved since the audit, a merge
that met conflicts) answers FAILED_PRECONDITION with the gate's reason and writes nothing to the
target; a publish whose verification failed answers INTERNAL (a retry finishes or reports it again).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import orjson

from api import world_manager_pb2 as pb
from api.errors import ApiError, InvalidRequest, NotFound
from worlds.api import Worlds
from worlds.publish import AuditRecord
from worlds.publish_run import Publisher, RunOutcome


class PublishRefused(ApiError):
    """The gate refused the run: nothing was written to the target."""

    code = grpc.StatusCode.FAILED_PRECONDITION


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def audit_response(rec: AuditRecord) -> pb.PublishAuditResponse:
    h = rec.heads
    return pb.PublishAuditResponse(
        plan_id=rec.plan_id,
        verdict=str(rec.verdict),
        blocked_by=rec.blocked_by,
        fast_forward=rec.fast_forward,
        source_hash=h.source_hash,
        target_hash=h.target_hash,
        base=h.base,
        json=_json(rec.to_json()),
    )


def run_response(out: RunOutcome) -> pb.PublishRunResponse:
    if out.outcome == "refused":
        raise PublishRefused(f"publish {out.plan_id} refused: {out.reason}")
    if out.outcome == "failed":
        raise ApiError(f"publish {out.plan_id} failed: {out.reason}")
    return pb.PublishRunResponse(
        plan_id=out.plan_id,
        action=out.action,
        outcome=out.outcome,
        reason=out.reason,
        commit_hash=out.commit or "",
        path=out.path or "",
        verified=bool(out.verified),
        source_deleted=bool(out.source_deleted),
        json=_json(out.to_json()),
    )


def _plan(p: Publisher, plan_id: str, target: str) -> AuditRecord:
    """The plan's audit record, if it publishes into ``target`` (the world the caller was authorized on)."""
    if not plan_id:
        raise InvalidRequest("plan_id is required (PublishAudit returns it)")
    record, _ = p.record(plan_id)
    if record.heads.target != target:
        raise NotFound(f"unknown plan {plan_id} into world {target!r}")
    return record


class PublishRpcs:
    """Mixin of :class:`api.service.WorldService`: the publish gate's RPCs."""

    if TYPE_CHECKING:
        from streams.settings import Settings

        settings: Settings
        _write: Callable[..., Awaitable[Any]]
        _blocking: Callable[[Callable[[Worlds], Any]], Awaitable[Any]]
        _who: Callable[[Any], str]

    async def PublishAudit(self, request: pb.PublishAuditRequest, context: Any) -> pb.PublishAuditResponse:  # noqa: N802
        who = self._who(context)

        def act_blocking(w: Worlds) -> pb.PublishAuditResponse:
            p = Publisher(w)
            limits = p.thresholds(
                request.max_drift if request.HasField("max_drift") else None,
                request.max_tables if request.HasField("max_tables") else None,
                request.max_changed_entities if request.HasField("max_changed_entities") else None,
            )
            return audit_response(p.audit(request.source_world_id, request.target_world_id or None, limits, by=who))

        async def act() -> pb.PublishAuditResponse:
            return await self._blocking(act_blocking)

        return await self._write(
            "PublishAudit", request.source_world_id, request, context, pb.PublishAuditResponse, act
        )

    async def PublishApprove(self, request: pb.PublishApproveRequest, context: Any) -> pb.PublishApproveResponse:  # noqa: N802
        who, target = self._who(context), request.target_world_id or self.settings.prod_world

        def act_blocking(w: Worlds) -> pb.PublishApproveResponse:
            p = Publisher(w)
            _plan(p, request.plan_id, target)
            entry = p.approve(request.plan_id, who, decline=request.decline)
            return pb.PublishApproveResponse(plan_id=request.plan_id, by=entry["by"], declined=entry["declined"])

        async def act() -> pb.PublishApproveResponse:
            return await self._blocking(act_blocking)

        return await self._write("PublishApprove", target, request, context, pb.PublishApproveResponse, act)

    async def PublishRun(self, request: pb.PublishRunRequest, context: Any) -> pb.PublishRunResponse:  # noqa: N802
        who, target = self._who(context), request.target_world_id or self.settings.prod_world

        def act_blocking(w: Worlds) -> pb.PublishRunResponse:
            p = Publisher(w)
            _plan(p, request.plan_id, target)
            out = p.run(
                request.plan_id,
                strategy=request.strategy or "NORMAL",
                keep_source=request.keep_source,
                execute=not request.dry_run,
                by=who,
            )
            return run_response(out)

        async def act() -> pb.PublishRunResponse:
            return await self._blocking(act_blocking)

        return await self._write("PublishRun", target, request, context, pb.PublishRunResponse, act)
