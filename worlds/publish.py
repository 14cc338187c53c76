"""Write-Audit-Publish gate, the pure half: plan ids, checks and verdicts, audit records, publish decisions.

No I/O here (``worlds.publish_run`` reads Nessie and writes the audit log). An audit looks at a
source world and a target world at two pinned heads and answers one of three verdicts:

* ``eligible``  – there is something to publish and every check passed;
* ``blocked``   – at least one check failed (``drift``, ``tables``, ``entities``, ``conflicts``);
* ``up-to-date`` – the source holds nothing the target lacks.

The **plan id** is a digest of (source, target, both heads, thresholds): auditing the same heads
with the same thresholds gives the same id, so an approval and a run refer to exactly what was
audited, and a second ``run`` of a plan id finds the first one's outcome in the log.

A plan is published only if both heads are still the audited ones (:func:`decide`): a moved head
refuses with "re-audit". When the target has not moved since the merge base the publish is a
fast-forward (the target's ref is moved to the source head, expecting the audited target hash);
otherwise it is the three-way merge of ``worlds.merge_run`` pinned at the audited hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import orjson

from worlds.errors import InvalidWorldRequest, WorldMoved, WorldNotFound, WorldsError


class PublishError(WorldsError):
    """A publish that cannot be done (unknown plan, not approved, blocked, moved heads, ...)."""


class InvalidPublish(PublishError, InvalidWorldRequest):
    """A publish request that is wrong as asked (thresholds, worlds, a missing approver)."""


class PlanNotFound(PublishError, WorldNotFound):
    """No audit record of that plan id."""


class PublishMoved(PublishError, WorldMoved):
    """The target moved since the audit: re-audit."""


class Verdict(StrEnum):
    ELIGIBLE = "eligible"
    BLOCKED = "blocked"
    UP_TO_DATE = "up-to-date"


class Check(StrEnum):
    DRIFT = "drift"
    TABLES = "tables"
    ENTITIES = "entities"
    CONFLICTS = "conflicts"


@dataclass(frozen=True)
class Thresholds:
    """Limits an audit checks; ``max_changed_entities`` None = no limit."""

    max_drift: int = 10
    max_tables: int = 25
    max_changed_entities: int | None = None

    def validate(self) -> None:
        if self.max_drift < 0 or self.max_tables < 1:
            raise InvalidPublish("thresholds: --max-drift must be >= 0 and --max-tables >= 1")
        if self.max_changed_entities is not None and self.max_changed_entities < 0:
            raise InvalidPublish("thresholds: --max-changed-entities must be >= 0")


@dataclass(frozen=True)
class Heads:
    """What an audit saw: both heads and their merge base."""

    source: str
    target: str
    source_hash: str
    target_hash: str
    base: str

    def validate(self) -> None:
        if not self.source or not self.target:
            raise InvalidPublish("source and target worlds are required")
        if self.source == self.target:
            raise InvalidPublish("source and target must differ")


@dataclass(frozen=True)
class Observed:
    """The measurements an audit checks: drift, tables changed (keys), entities changed, conflicts."""

    drift: int  # commits the target is ahead of the merge base
    tables_added: tuple[str, ...] = ()
    tables_updated: tuple[str, ...] = ()
    tables_removed: tuple[str, ...] = ()
    entities: Mapping[str, int] = field(default_factory=dict)  # added / removed / modified, source vs base
    conflicts: tuple[Mapping[str, Any], ...] = ()
    source_ahead: int = 0  # commits of the source since the base

    @property
    def tables(self) -> int:
        return len(self.tables_added) + len(self.tables_updated) + len(self.tables_removed)

    @property
    def changed_entities(self) -> int:
        return sum(self.entities.values())


@dataclass(frozen=True)
class CheckResult:
    check: Check
    ok: bool
    value: int
    limit: int | None
    detail: str


#: exit codes of ``causeway publish audit``: 0 eligible, 3 up to date, 10+ blocked (first failing check)
EXIT_ELIGIBLE, EXIT_UP_TO_DATE = 0, 3
EXIT_BLOCKED = {Check.DRIFT: 10, Check.TABLES: 11, Check.ENTITIES: 12, Check.CONFLICTS: 13}


def exit_code(record: AuditRecord) -> int:
    if record.verdict is Verdict.ELIGIBLE:
        return EXIT_ELIGIBLE
    if record.verdict is Verdict.UP_TO_DATE:
        return EXIT_UP_TO_DATE
    return EXIT_BLOCKED[Check(record.blocked_by[0])]


def plan_id(heads: Heads, thresholds: Thresholds) -> str:
    """Stable id of an audit: the same heads and thresholds always give the same id."""
    doc = orjson.dumps({"heads": asdict(heads), "thresholds": asdict(thresholds)}, option=orjson.OPT_SORT_KEYS)
    return "pl-" + hashlib.sha256(doc).hexdigest()[:16]


def run_checks(obs: Observed, t: Thresholds) -> list[CheckResult]:
    """Every check with its verdict (all are evaluated, so the record lists every failing one)."""
    out = [
        CheckResult(
            Check.DRIFT,
            obs.drift <= t.max_drift,
            obs.drift,
            t.max_drift,
            f"target is {obs.drift} commit(s) ahead of the merge base (max {t.max_drift})",
        ),
        CheckResult(
            Check.TABLES,
            obs.tables <= t.max_tables,
            obs.tables,
            t.max_tables,
            f"{obs.tables} table(s) modified (max {t.max_tables})",
        ),
    ]
    lim = t.max_changed_entities
    n = obs.changed_entities
    out.append(
        CheckResult(
            Check.ENTITIES,
            lim is None or n <= lim,
            n,
            lim,
            f"{n} entit{'y' if n == 1 else 'ies'} changed" + (f" (max {lim})" if lim is not None else " (no limit)"),
        )
    )
    c = len(obs.conflicts)
    out.append(CheckResult(Check.CONFLICTS, c == 0, c, 0, f"{c} merge conflict(s) under NORMAL"))
    return out


def verdict(heads: Heads, obs: Observed, checks: Sequence[CheckResult]) -> Verdict:
    """``up-to-date`` when the source has nothing new, else ``blocked`` if any check failed, else eligible."""
    if heads.base == heads.source_hash or heads.source_hash == heads.target_hash:
        return Verdict.UP_TO_DATE  # the source is an ancestor of the target
    if obs.tables == 0 and obs.changed_entities == 0:
        return Verdict.UP_TO_DATE  # commits that changed no table (nothing to publish)
    if any(not c.ok for c in checks):
        return Verdict.BLOCKED
    return Verdict.ELIGIBLE


def is_fast_forward(heads: Heads) -> bool:
    """The target has not moved since the merge base: publishing moves its ref to the source head."""
    return heads.target_hash == heads.base


@dataclass(frozen=True)
class AuditRecord:
    """One audit, as written to the audit log and printed by ``publish audit --json``."""

    plan_id: str
    heads: Heads
    thresholds: Thresholds
    observed: Observed
    checks: tuple[CheckResult, ...]
    verdict: Verdict
    by: str
    at: datetime

    @property
    def blocked_by(self) -> list[str]:
        return [str(c.check) for c in self.checks if not c.ok]

    @property
    def fast_forward(self) -> bool:
        return is_fast_forward(self.heads)

    def to_json(self) -> dict[str, Any]:
        o = self.observed
        return {
            "plan_id": self.plan_id,
            "verdict": str(self.verdict),
            "blocked_by": self.blocked_by,
            "source": self.heads.source,
            "target": self.heads.target,
            "source_hash": self.heads.source_hash,
            "target_hash": self.heads.target_hash,
            "base": self.heads.base,
            "fast_forward": self.fast_forward,
            "thresholds": asdict(self.thresholds),
            "diff": {
                "drift_commits": o.drift,
                "source_commits": o.source_ahead,
                "tables": {
                    "added": list(o.tables_added),
                    "updated": list(o.tables_updated),
                    "removed": list(o.tables_removed),
                },
                "tables_modified": o.tables,
                "entities": dict(o.entities),
                "entities_changed": o.changed_entities,
            },
            "checks": [
                {"check": str(c.check), "ok": c.ok, "value": c.value, "limit": c.limit, "detail": c.detail}
                for c in self.checks
            ],
            "conflicts": [dict(c) for c in o.conflicts],
            "by": self.by,
            "at": self.at.isoformat(),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AuditRecord:
        diff = d["diff"]
        heads = Heads(d["source"], d["target"], d["source_hash"], d["target_hash"], d["base"])
        obs = Observed(
            drift=diff["drift_commits"],
            tables_added=tuple(diff["tables"]["added"]),
            tables_updated=tuple(diff["tables"]["updated"]),
            tables_removed=tuple(diff["tables"]["removed"]),
            entities=dict(diff["entities"]),
            conflicts=tuple(d.get("conflicts") or ()),
            source_ahead=diff.get("source_commits", 0),
        )
        checks = tuple(
            CheckResult(Check(c["check"]), c["ok"], c["value"], c["limit"], c["detail"]) for c in d["checks"]
        )
        return cls(
            d["plan_id"],
            heads,
            Thresholds(**d["thresholds"]),
            obs,
            checks,
            Verdict(d["verdict"]),
            d["by"],
            datetime.fromisoformat(d["at"]),
        )


def audit(heads: Heads, obs: Observed, thresholds: Thresholds, by: str, at: datetime) -> AuditRecord:
    """Check the observations and build the record (the plan id comes from heads and thresholds)."""
    heads.validate()
    thresholds.validate()
    checks = tuple(run_checks(obs, thresholds))
    return AuditRecord(plan_id(heads, thresholds), heads, thresholds, obs, checks, verdict(heads, obs, checks), by, at)


# --- the publish decision --------------------------------------------------------------------------


class Action(StrEnum):
    FAST_FORWARD = "fast-forward"
    MERGE = "merge"
    COMPLETE = "complete"  # the publish commit landed already (a crash before cleanup): finish the steps
    DONE = "done"  # the plan was published: report the first outcome
    REFUSE = "refuse"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def decide(
    record: AuditRecord,
    *,
    approved: bool,
    outcome: str | None,
    source_hash: str | None,
    target_hash: str | None,
    landed: bool,
) -> Decision:
    """What ``publish run`` does now.

    ``outcome``: the plan's last recorded run outcome (``published`` ends it); ``source_hash`` /
    ``target_hash``: the current heads (None = the branch is gone); ``landed``: the target already
    holds this plan's publish (its head is the source head after a fast-forward, or a merge commit
    of this source hash sits on the target after the audited head).
    """
    if outcome == "published":
        return Decision(Action.DONE, "already published")
    if record.verdict is Verdict.UP_TO_DATE:
        return Decision(Action.REFUSE, "nothing to publish: the target is up to date")
    if record.verdict is Verdict.BLOCKED:
        return Decision(Action.REFUSE, f"blocked by {', '.join(record.blocked_by)}")
    if not approved:
        return Decision(Action.REFUSE, f"not approved: run `causeway publish approve {record.plan_id} --by NAME`")
    if landed:  # only an approved, eligible plan can have been published by an interrupted run
        return Decision(Action.COMPLETE, "the publish commit is on the target; finishing verify, cleanup and log")
    moved = []
    if source_hash != record.heads.source_hash:
        moved.append(
            f"source {record.heads.source} is at {_short(source_hash)}, audited {_short(record.heads.source_hash)}"
        )
    if target_hash != record.heads.target_hash:
        moved.append(
            f"target {record.heads.target} is at {_short(target_hash)}, audited {_short(record.heads.target_hash)}"
        )
    if moved:
        return Decision(Action.REFUSE, "heads moved since the audit (" + "; ".join(moved) + "): re-audit")
    if record.fast_forward:
        return Decision(Action.FAST_FORWARD, "the target has not moved since the merge base")
    return Decision(Action.MERGE, "the target moved since the merge base: three-way merge")


def _short(h: str | None) -> str:
    return h[:12] if h else "(deleted)"


# --- state across runs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BranchState:
    """Per source world: its last audit, verdict, first-seen time and staleness."""

    source: str
    target: str
    last_plan: str
    last_verdict: str
    blocked_by: tuple[str, ...]
    first_seen: datetime
    last_audit: datetime
    last_changed: datetime | None  # commit time of the source head
    drift: int
    outcome: str | None  # last run outcome of the last plan

    def staleness_seconds(self, now: datetime) -> float:
        """Time since the source branch last changed (0 when unknown)."""
        return max(0.0, (now - self.last_changed).total_seconds()) if self.last_changed else 0.0


def fold_state(entries: Sequence[Mapping[str, Any]]) -> dict[str, BranchState]:
    """Per source world, the state the log entries (oldest first) leave behind."""
    out: dict[str, BranchState] = {}
    plans: dict[str, str] = {}
    for e in entries:
        kind = e.get("kind")
        if kind == "audit":
            r = e["record"]
            prev = out.get(r["source"])
            changed = e.get("source_changed")
            out[r["source"]] = BranchState(
                source=r["source"],
                target=r["target"],
                last_plan=r["plan_id"],
                last_verdict=r["verdict"],
                blocked_by=tuple(r["blocked_by"]),
                first_seen=prev.first_seen if prev else datetime.fromisoformat(r["at"]),
                last_audit=datetime.fromisoformat(r["at"]),
                last_changed=datetime.fromisoformat(changed) if changed else None,
                drift=r["diff"]["drift_commits"],
                outcome=None,
            )
            plans[r["plan_id"]] = r["source"]
        elif kind == "run" and e.get("plan_id") in plans:
            src = plans[e["plan_id"]]
            st = out[src]
            if st.last_plan == e["plan_id"]:
                out[src] = BranchState(**{**asdict(st), "outcome": e.get("outcome")})
    return out


def plan_status(
    entries: Sequence[Mapping[str, Any]], pid: str
) -> tuple[dict[str, Any] | None, str | None, str | None, dict[str, Any] | None]:
    """``(audit record json, approved by, last run outcome, the published run entry)`` for one plan."""
    record = by = outcome = None
    published = None
    for e in entries:
        if e.get("plan_id") != pid and (e.get("record") or {}).get("plan_id") != pid:
            continue
        if e["kind"] == "audit" and record is None:
            record = e["record"]
        elif e["kind"] == "approve":
            by = e.get("by")
        elif e["kind"] == "run":
            outcome = e.get("outcome")
            if outcome == "published" and published is None:
                published = dict(e)
    if published is not None:
        outcome = "published"
    return record, by, outcome, published
