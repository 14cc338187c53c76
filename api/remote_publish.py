"""The publish commands over the API: the Write-Audit-Publish gate answered by ``causeway serve``.

``cli.publish`` uses :class:`RemotePublisher` instead of ``worlds.publish_run.Publisher`` when
``CAUSEWAY_API_URL`` is set. Each method returns what the local gate returns (the same
``AuditRecord``, ``RunOutcome`` and ``BranchState`` records, rebuilt from the messages), so the
commands print and exit one way whichever path answered. The server records the caller's token name
as the auditor, approver and runner (``--by`` is not sent). A gRPC error becomes a
:class:`WorldsError` naming the status code; a refused or failed run is not an error here: its
outcome travels in the status details and is returned like the local gate's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import grpc
import orjson

from api import world_manager_pb2 as pb
from api.client import WorldClient
from api.remote import Remote
from worlds.errors import WorldsError
from worlds.publish import AuditRecord, BranchState, PlanNotFound
from worlds.publish_run import RunOutcome

_RUN_FIELDS = ("plan_id", "action", "outcome", "reason", "executed", "commit", "path", "verified", "source_deleted")


def run_outcome(resp: pb.PublishRunResponse) -> RunOutcome:
    """The ``RunOutcome`` the server's gate returned (its ``to_json`` travels in ``json``)."""
    if not resp.json:
        raise WorldsError(f"the server sent publish outcome {resp.outcome!r} of {resp.plan_id} without its record")
    doc: dict[str, Any] = orjson.loads(resp.json)
    known = {k: doc.pop(k) for k in _RUN_FIELDS}
    return RunOutcome(**known, detail=doc)


def branch_state(s: pb.PublishBranchState) -> BranchState:
    return BranchState(
        source=s.source,
        target=s.target,
        last_plan=s.plan_id,
        last_verdict=s.verdict,
        blocked_by=tuple(s.blocked_by),
        first_seen=datetime.fromisoformat(s.first_seen),
        last_audit=datetime.fromisoformat(s.last_audit),
        last_changed=datetime.fromisoformat(s.last_changed) if s.last_changed else None,
        drift=s.drift,
        outcome=s.outcome or None,
    )


class RemotePublisher(Remote):
    """The gate's four operations (audit, approve, run, status) over gRPC."""

    def _target(self, plan_id: str) -> str:
        """The plan's target world, from its audit entry in the publish log (the RPCs are authorized on it)."""
        for raw in self._call(lambda: self.client.publish_log(plan_id)):
            entry = orjson.loads(raw)
            if entry.get("kind") == "audit":
                return str(entry["record"]["target"])
        raise PlanNotFound(f"unknown plan {plan_id}: run `causeway publish audit` first")

    def audit(
        self,
        source: str,
        target: str | None,
        max_drift: int | None = None,
        max_tables: int | None = None,
        max_changed_entities: int | None = None,
    ) -> AuditRecord:
        """Limits left None are the server's settings (``CAUSEWAY_PUBLISH_MAX_*``)."""
        resp = self._call(
            lambda: self.client.publish_audit(
                source,
                target or "",
                max_drift=max_drift,
                max_tables=max_tables,
                max_changed_entities=max_changed_entities,
            )
        )
        return AuditRecord.from_json(orjson.loads(resp.json))

    def approve(self, plan_id: str, *, decline: bool = False) -> str:
        """Approve (or decline) the plan; returns who the server recorded (the token's name)."""
        target = self._target(plan_id)
        return self._call(lambda: self.client.publish_approve(plan_id, target, decline=decline)).by

    def run(self, plan_id: str, *, strategy: str, keep_source: bool, execute: bool) -> RunOutcome:
        target = self._target(plan_id)
        try:
            resp = self.client.publish_run(
                plan_id, target, strategy=strategy, keep_source=keep_source, dry_run=not execute
            )
        except grpc.RpcError as exc:
            carried = WorldClient.run_of(exc)  # refused or failed: the outcome is in the status details
            if carried is None or not carried.json:
                raise WorldsError(f"API {exc.code().name}: {exc.details()}") from exc
            return run_outcome(carried)
        return run_outcome(resp)

    def status(self) -> dict[str, BranchState]:
        return {s.source: branch_state(s) for s in self._call(self.client.publish_status)}
