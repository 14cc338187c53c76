"""The Write-Audit-Publish RPCs of the world manager service: PublishAudit, PublishApprove, PublishRun,
and the reads PublishStatus and ListPublishLog.

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
Both carry the run's ``PublishRunResponse`` packed in the status details, so a client (the CLI)
prints the same outcome as the gate's Python API returns.

``PublishStatus`` (the state per source world, paged by source) and ``ListPublishLog`` (a plan's or
the whole log's entries, oldest first, paged) are reads: role ``reader``, no world to check.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import orjson
from google.protobuf import any_pb2
from google.rpc import status_pb2

from agents import faults
from api import paging
from api import world_manager_pb2 as pb
from api.errors import ApiError, InvalidRequest, NotFound
from api.merge_rpcs import DETAILS_BUDGET
from worlds.api import Worlds
from worlds.publish import AuditRecord, BranchState
from worlds.publish_run import Publisher, RunOutcome


class PublishRefused(ApiError):
    """The gate refused the run: nothing was written to the target."""

    code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, message: str, status_details: bytes = b"") -> None:
        super().__init__(message)
        self.status_details = status_details


class PublishFailed(ApiError):
    """The publish landed but its verification failed (INTERNAL: not stored, a retry reports it again)."""

    def __init__(self, message: str, status_details: bytes = b"") -> None:
        super().__init__(message)
        self.status_details = status_details


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


def run_details(code: grpc.StatusCode, message: str, resp: pb.PublishRunResponse) -> bytes:
    """A ``google.rpc.Status`` holding the run's response (its ``json`` dropped if it would not fit)."""
    if resp.ByteSize() > DETAILS_BUDGET:
        slim = pb.PublishRunResponse()
        slim.CopyFrom(resp)
        slim.json = ""
        resp = slim
    packed = any_pb2.Any()
    packed.Pack(resp)
    return status_pb2.Status(code=code.value[0], message=message, details=[packed]).SerializeToString()


def run_response(out: RunOutcome) -> pb.PublishRunResponse:
    resp = _run_message(out)
    if out.outcome == "refused":
        message = f"publish {out.plan_id} refused: {out.reason}"
        raise PublishRefused(message, run_details(PublishRefused.code, message, resp))
    if out.outcome == "failed":
        message = f"publish {out.plan_id} failed: {out.reason}"
        raise PublishFailed(message, run_details(PublishFailed.code, message, resp))
    return resp


def _run_message(out: RunOutcome) -> pb.PublishRunResponse:
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


def _state(s: BranchState) -> pb.PublishBranchState:
    return pb.PublishBranchState(
        source=s.source,
        target=s.target,
        plan_id=s.last_plan,
        verdict=s.last_verdict,
        blocked_by=list(s.blocked_by),
        drift=s.drift,
        first_seen=s.first_seen.isoformat(),
        last_audit=s.last_audit.isoformat(),
        last_changed=s.last_changed.isoformat() if s.last_changed else "",
        outcome=s.outcome or "",
    )


def status_page(states: dict[str, BranchState], page_size: int, page_token: str) -> pb.PublishStatusResponse:
    """One page of the per-source states, by source world; the token resumes after the last source sent."""
    size = paging.page_size(page_size)
    state = paging.decode(page_token, "publish-status") or {}
    rest = paging.after(sorted(states.values(), key=lambda s: s.source), lambda s: s.source, state.get("after"))
    page = rest[:size]
    token = paging.encode("publish-status", after=page[-1].source) if len(rest) > size else ""
    return pb.PublishStatusResponse(states=[_state(s) for s in page], next_page_token=token)


def log_page(entries: list[dict[str, Any]], page_size: int, page_token: str) -> pb.ListPublishLogResponse:
    """One page of log entries (oldest first); the token names the last entry sent by its log commit.

    The log is append-only, so a later page never misses or repeats an entry; a token whose entry is
    not in the log (another plan's token, a log branch reset) is refused.
    """
    size = paging.page_size(page_size)
    state = paging.decode(page_token, "publish-log")
    start = 0
    if state is not None:
        commits = [e.get("log_commit") for e in entries]
        if state.get("after") not in commits:
            raise InvalidRequest("page_token names an entry this publish log does not hold")
        start = commits.index(state["after"]) + 1
    page = entries[start : start + size]
    more = start + size < len(entries)
    return pb.ListPublishLogResponse(
        entries_json=[_json(e) for e in page],
        next_page_token=paging.encode("publish-log", after=page[-1]["log_commit"]) if more else "",
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
        _read: Callable[..., Awaitable[Any]]
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
            # the fault point the CLI has too: kill tests stop the server right after the publish landed
            p = Publisher(w, after_publish=lambda: faults.reached("publish-after-commit"))
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

    async def PublishStatus(self, request: pb.PublishStatusRequest, context: Any) -> pb.PublishStatusResponse:  # noqa: N802
        async def act() -> pb.PublishStatusResponse:
            states = await self._blocking(lambda w: Publisher(w).status())
            return status_page(states, request.page_size, request.page_token)

        return await self._read("PublishStatus", None, context, act)

    async def ListPublishLog(self, request: pb.ListPublishLogRequest, context: Any) -> pb.ListPublishLogResponse:  # noqa: N802
        async def act() -> pb.ListPublishLogResponse:
            entries = await self._blocking(lambda w: Publisher(w).log.entries(request.plan_id or None))
            return log_page(entries, request.page_size, request.page_token)

        return await self._read("ListPublishLog", None, context, act)
