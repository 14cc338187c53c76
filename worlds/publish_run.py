"""Write-Audit-Publish gate, the I/O half: audit two worlds, approve a plan, publish it once.

The decisions are ``worlds.publish``'s; this module reads Nessie and the warehouse (through
:class:`worlds.api.Worlds`), writes the target (a fast-forward with the audited target hash as the
expected hash, or the three-way merge of ``worlds.merge_run`` pinned at the audited hashes) and
appends every step to :class:`worlds.publish_log.PublishLog`.

Order of a run: decide → publish (one atomic Nessie operation on the target) → ``after_publish``
(the CLI wires the fault point ``publish-after-commit`` there) → verify (the target's head holds
the publish and its diff against the audited target touches exactly / only the audited tables) →
delete the source (expecting the audited source hash) unless kept → log the outcome → notify.
A crash anywhere after the publish leaves it findable on the target (:meth:`Publisher.landed`),
so the next ``run`` of the plan finishes verify, cleanup and log without publishing again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sinks.errors import NessieConflict, NessieNotFound
from sinks.nessie import IcebergTable, Reference
from worlds.api import Worlds
from worlds.diff_read import diff_table
from worlds.merge import MergeError, Strategies
from worlds.merge_read import PROJECTIONS, PROP_MERGE_SOURCE, PROP_MERGE_SOURCE_HASH, find_base
from worlds.merge_run import _entries
from worlds.publish import (
    Action,
    AuditRecord,
    BranchState,
    Heads,
    InvalidPublish,
    Observed,
    PlanNotFound,
    PublishError,
    PublishMoved,
    Thresholds,
    Verdict,
    audit,
    decide,
    fold_state,
    plan_status,
)
from worlds.publish_log import PublishLog
from worlds.publish_notify import notify

log = logging.getLogger(__name__)
MAX_WALK = 10_000  # commits walked to count drift or find a landed publish
MAX_CONFLICTS_LOGGED = 200


@dataclass
class RunOutcome:
    """What ``publish run`` did (or, dry, would do)."""

    plan_id: str
    action: str
    outcome: str  # planned | published | refused | failed
    reason: str
    executed: bool
    commit: str | None = None
    path: str | None = None
    verified: bool | None = None
    source_deleted: bool | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "action": self.action,
            "outcome": self.outcome,
            "reason": self.reason,
            "executed": self.executed,
            "commit": self.commit,
            "path": self.path,
            "verified": self.verified,
            "source_deleted": self.source_deleted,
            **self.detail,
        }


class Publisher:
    """The gate over one :class:`Worlds` API; ``log`` defaults to the settings' log branch."""

    def __init__(
        self, worlds: Worlds, log_branch: str | None = None, after_publish: Callable[[], None] | None = None
    ) -> None:
        """``after_publish``: called right after the publish lands (the CLI's kill -9 fault point)."""
        self.worlds = worlds
        self.after_publish = after_publish
        self.settings = worlds.settings
        self.client = worlds.client
        self.log = PublishLog(self.client, log_branch or self.settings.publish_log_branch, self.settings.commit_author)

    def thresholds(
        self, max_drift: int | None = None, max_tables: int | None = None, max_entities: int | None = None
    ) -> Thresholds:
        s = self.settings
        ent = max_entities if max_entities is not None else (s.publish_max_changed_entities or None)
        return Thresholds(
            s.publish_max_drift if max_drift is None else max_drift,
            s.publish_max_tables if max_tables is None else max_tables,
            ent,
        )

    # --- audit -------------------------------------------------------------------------------------

    def audit(
        self,
        source: str,
        target: str | None = None,
        thresholds: Thresholds | None = None,
        by: str = "",
        *,
        notify: bool = True,
    ) -> AuditRecord:
        """Resolve both heads, measure, check, log and return the audit record."""
        target = target or self.settings.prod_world
        thresholds = thresholds or self.thresholds()
        if source == target:
            raise InvalidPublish("source and target must differ")
        w = self.worlds
        sref, tref = w.head(source), w.head(target)
        sb, tb = sref.name, tref.name
        found = find_base(_entries(self.client, sref.pinned), _entries(self.client, tref.pinned), source, target)
        if found is None:
            raise PublishError(f"worlds {source} and {target} share no history: nothing to audit")
        base, on = found
        heads = Heads(source, target, sref.hash, tref.hash, base)
        base_ref = f"{sb if on == 'source' else tb}@{base}"
        added, updated, removed = self._table_diff(base_ref, sref.pinned)
        entities: dict[str, int] = {"added": 0, "removed": 0, "modified": 0}
        for name, kind, type_col, pk_col in PROJECTIONS:
            td = diff_table(name, kind, w.table(base_ref, name), w.table(sref.pinned, name), type_col, pk_col)
            for c in td.changes:
                entities[c.change] += 1
        conflicts: list[dict[str, Any]] = []
        if tref.hash != base and sref.hash != base:
            plan = w.plan_merge(source, target, Strategies.parse("NORMAL"), at=(sref.hash, tref.hash))
            conflicts = [c.to_json() for c in plan.result.conflicts][:MAX_CONFLICTS_LOGGED]
            conflicts += [{"conflict": "SCHEMA", **s} for s in plan.schema]
        obs = Observed(
            drift=self._count_until(tref.pinned, base, source),
            tables_added=added,
            tables_updated=updated,
            tables_removed=removed,
            entities=entities,
            conflicts=tuple(conflicts),
            source_ahead=self._count_until(sref.pinned, base, None),
        )
        record = audit(heads, obs, thresholds, by or self.settings.commit_author, datetime.now(UTC))
        changed = w._commit_time(sref.pinned)
        self.log.append(
            {
                "kind": "audit",
                "plan_id": record.plan_id,
                "record": record.to_json(),
                "source_changed": changed.isoformat() if changed else None,
            }
        )
        if notify and record.verdict is Verdict.BLOCKED:
            self._notify("blocked", record, reason="blocked by " + ", ".join(record.blocked_by))
        return record

    def _table_diff(self, a: str, b: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        added: list[str] = []
        updated: list[str] = []
        removed: list[str] = []
        for d in self.client.diff(a, b):
            if not isinstance(d.from_content or d.to_content, IcebergTable):
                continue
            name = ".".join(d.key)
            (added if d.from_content is None else removed if d.to_content is None else updated).append(name)
        return tuple(sorted(added)), tuple(sorted(updated)), tuple(sorted(removed))

    def _count_until(self, ref: str, base: str, merged_from: str | None) -> int:
        """Commits of ``ref`` newer than ``base`` (or than the merge commit that merged ``base``)."""
        n = 0
        for entry in _entries(self.client, ref):
            if entry.hash == base:
                return n
            props = entry.properties
            if (
                merged_from
                and props.get(PROP_MERGE_SOURCE) == merged_from
                and props.get(PROP_MERGE_SOURCE_HASH) == base
            ):
                return n
            n += 1
            if n >= MAX_WALK:
                break
        return n

    # --- approve -----------------------------------------------------------------------------------

    def record(self, plan_id: str) -> tuple[AuditRecord, list[dict[str, Any]]]:
        entries = self.log.entries(plan_id)
        rec, _, _, _ = plan_status(entries, plan_id)
        if rec is None:
            raise PlanNotFound(f"unknown plan {plan_id}: run `causeway publish audit` first")
        return AuditRecord.from_json(rec), entries

    def approve(self, plan_id: str, by: str, *, decline: bool = False) -> dict[str, Any]:
        if not by.strip():
            raise InvalidPublish("--by NAME is required")
        record, _ = self.record(plan_id)
        if record.verdict is not Verdict.ELIGIBLE and not decline:
            raise PublishError(
                f"plan {plan_id} is {record.verdict} "
                f"({', '.join(record.blocked_by) or 'nothing to publish'}): cannot approve"
            )
        entry = {"kind": "approve", "plan_id": plan_id, "by": by, "declined": decline, "at": _now()}
        self.log.append(entry)
        if decline:
            self._notify("declined", record, reason=f"declined by {by}")
        return entry

    # --- run ---------------------------------------------------------------------------------------

    def landed(self, record: AuditRecord, target_hash: str | None) -> str | None:
        """The target commit holding this plan's publish, if it landed (walks back to the audited head)."""
        if target_hash is None:
            return None
        h = record.heads
        tb = self.worlds.branch(h.target)
        for n, entry in enumerate(_entries(self.client, f"{tb}@{target_hash}")):
            if entry.hash == h.source_hash:
                return entry.hash  # fast-forwarded
            p = entry.properties
            if p.get(PROP_MERGE_SOURCE) == h.source and p.get(PROP_MERGE_SOURCE_HASH) == h.source_hash:
                return entry.hash  # merged
            if entry.hash == h.target_hash or n >= MAX_WALK:
                return None
        return None

    def _head_or_none(self, world: str) -> str | None:
        try:
            return self.client.get_reference(self.worlds.branch(world)).hash
        except NessieNotFound:
            return None

    def run(
        self,
        plan_id: str,
        *,
        strategy: str = "NORMAL",
        keep_source: bool = False,
        execute: bool = False,
        by: str = "",
    ) -> RunOutcome:
        record, entries = self.record(plan_id)
        _, approved_by, last, published = plan_status(entries, plan_id)
        if published is not None:
            out = RunOutcome(plan_id, str(Action.DONE), "published", "already published (first run's result)", False)
            out.commit, out.path = published.get("commit"), published.get("path")
            out.verified, out.source_deleted = published.get("verified"), published.get("source_deleted")
            return out
        declined = any(e.get("kind") == "approve" and e.get("declined") for e in entries)
        h = record.heads
        s_now, t_now = self._head_or_none(h.source), self._head_or_none(h.target)
        commit = self.landed(record, t_now)
        d = decide(
            record,
            approved=approved_by is not None and not declined,
            outcome=last,
            source_hash=s_now,
            target_hash=t_now,
            landed=commit is not None,
        )
        if declined and d.action is Action.REFUSE and d.reason.startswith("not approved"):
            d = type(d)(Action.REFUSE, "declined by the approver")
        out = RunOutcome(plan_id, str(d.action), "planned", d.reason, execute)
        if d.action is Action.REFUSE:
            out.outcome = "refused"
            if execute:
                self._finish(record, out, by)
            return out
        if not execute:
            out.reason = f"dry run: would {d.action} ({d.reason}); add --execute to publish"
            return out
        try:
            if d.action is Action.FAST_FORWARD:
                out.path = "fast-forward"
                commit = self._fast_forward(record)
            elif d.action is Action.MERGE:
                out.path = "merge"
                commit = self._merge(record, strategy, out)
            else:
                out.path = "complete"
        except PublishError as exc:
            out.outcome, out.reason = "refused", str(exc)
            self._finish(record, out, by)
            return out
        if commit is None:
            self._finish(record, out, by)
            return out
        out.commit = commit
        if self.after_publish is not None:
            self.after_publish()
        problems = self.verify(record, commit)
        out.verified = not problems
        if problems:
            out.outcome, out.reason = "failed", "verify failed: " + "; ".join(problems)
            self._finish(record, out, by)
            return out
        out.source_deleted = False if keep_source else self._delete_source(record, out)
        out.outcome = "published"
        if d.action is Action.COMPLETE:
            out.reason = "the publish had landed before a crash: verified, cleaned up and logged now (published once)"
        else:
            out.reason = f"published by {out.path}"
        self._finish(record, out, by)
        return out

    def _fast_forward(self, record: AuditRecord) -> str:
        h = record.heads
        to = Reference(self.worlds.branch(h.source), "BRANCH", h.source_hash)
        try:
            new = self.client.assign_reference(self.worlds.branch(h.target), h.target_hash, to)
        except NessieConflict:
            raise PublishMoved(f"target {h.target} moved since the audit: re-audit") from None
        return new.hash

    def _merge(self, record: AuditRecord, strategy: str, out: RunOutcome) -> str | None:
        h = record.heads
        try:
            strategies = Strategies.parse(strategy)
            merged = self.worlds._merge(  # pinned at the audited hashes: a moved target raises
                h.source,
                h.target,
                strategies,
                at=(h.source_hash, h.target_hash),
                message=f"publish {record.plan_id}: {h.source} into {h.target}",
            )
        except MergeError as exc:
            raise PublishError(f"{exc} (re-audit)") from None
        out.detail["merge"] = {"status": merged.status, **merged.result.summary()}
        if merged.status != "merged":
            out.outcome, out.reason = "refused", f"merge {merged.status} under {strategy}: nothing written"
            return None
        return merged.committed

    def verify(self, record: AuditRecord, commit: str) -> list[str]:
        """Problems with the published state: the target head must hold ``commit``, and the tables it
        changed since the audited target head must be the audited ones (all of them for a fast-forward)."""
        h = record.heads
        t_now = self._head_or_none(h.target)
        if t_now is None or self.landed(record, t_now) is None:
            return [f"target {h.target} head {t_now} does not hold the publish {commit[:12]}"]
        tb = self.worlds.branch(h.target)
        added, updated, removed = self._table_diff(f"{tb}@{h.target_hash}", f"{tb}@{commit}")
        changed = set(added) | set(updated) | set(removed)
        o = record.observed
        planned = set(o.tables_added) | set(o.tables_updated) | set(o.tables_removed)
        if record.fast_forward and changed != planned:
            return [f"tables changed {sorted(changed)} != audited {sorted(planned)}"]
        if not record.fast_forward and not changed <= planned:
            return [f"tables changed {sorted(changed - planned)} beyond the audited {sorted(planned)}"]
        return []

    def _delete_source(self, record: AuditRecord, out: RunOutcome) -> bool:
        h = record.heads
        try:
            self.client.delete_reference(self.worlds.branch(h.source), h.source_hash)
            return True
        except NessieNotFound:
            return True  # deleted by an earlier, interrupted run
        except NessieConflict:
            out.detail["source_note"] = f"source {h.source} moved after the audit: kept"
            return False

    def _finish(self, record: AuditRecord, out: RunOutcome, by: str) -> None:
        """The one place a run outcome is logged and notified."""
        self.log.append({"kind": "run", "at": _now(), "by": by or self.settings.commit_author, **out.to_json()})
        event = {"published": "published", "failed": "failed"}.get(out.outcome, "blocked")
        self._notify(event, record, reason=out.reason, commit=out.commit or "", path=out.path or "")

    def _notify(self, event: str, record: AuditRecord, **extra: str) -> None:
        url = self.settings.publish_webhook_url
        detail = {
            "plan_id": record.plan_id,
            "source": record.heads.source,
            "target": record.heads.target,
            "tables_modified": record.observed.tables,
            **extra,
        }
        notify(url.reveal() if hasattr(url, "reveal") else str(url), event, detail)

    # --- status ------------------------------------------------------------------------------------

    def status(self) -> dict[str, BranchState]:
        return fold_state(self.log.entries())


def _now() -> str:
    return datetime.now(UTC).isoformat()
