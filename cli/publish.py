"""`causeway publish audit|approve|run|status`: the Write-Audit-Publish gate (docs/publish.md).

Thin shells over the gate: ``worlds.publish_run.Publisher`` on Nessie directly, or, with
``CAUSEWAY_API_URL`` set, ``api.remote_publish.RemotePublisher`` over the world manager API (its
tokens, roles, idempotency keys and audit log; the token's name is recorded instead of ``--by``).
Both answer the same records, so each command prints and exits one way. Decisions live in
``worlds.publish``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Protocol

import click

from cli.world_history import _errors, _json, _local, _summary
from streams.settings import Settings
from worlds.publish import AuditRecord, BranchState, exit_code
from worlds.publish_run import Publisher, RunOutcome


class Gate(Protocol):
    """What the commands call: the local gate below or ``api.remote_publish.RemotePublisher``."""

    def audit(
        self,
        source: str,
        target: str | None,
        max_drift: int | None = None,
        max_tables: int | None = None,
        max_changed_entities: int | None = None,
    ) -> AuditRecord: ...

    def approve(self, plan_id: str, *, decline: bool = False) -> str: ...

    def run(self, plan_id: str, *, strategy: str, keep_source: bool, execute: bool) -> RunOutcome: ...

    def status(self) -> dict[str, BranchState]: ...


class _Local:
    """The gate on Nessie directly; ``by`` is who the log records."""

    def __init__(self, publisher: Publisher, by: str) -> None:
        self.p, self.by = publisher, by

    def audit(
        self,
        source: str,
        target: str | None,
        max_drift: int | None = None,
        max_tables: int | None = None,
        max_changed_entities: int | None = None,
    ) -> AuditRecord:
        return self.p.audit(source, target, self.p.thresholds(max_drift, max_tables, max_changed_entities), by=self.by)

    def approve(self, plan_id: str, *, decline: bool = False) -> str:
        return str(self.p.approve(plan_id, self.by, decline=decline)["by"])

    def run(self, plan_id: str, *, strategy: str, keep_source: bool, execute: bool) -> RunOutcome:
        return self.p.run(plan_id, strategy=strategy, keep_source=keep_source, execute=execute, by=self.by)

    def status(self) -> dict[str, BranchState]:
        return self.p.status()


@contextmanager
def _publisher(settings: Settings, by: str = "") -> Iterator[Gate]:
    if settings.api_url:  # through the world manager API: docs/api.md
        from api.remote_publish import RemotePublisher

        with _errors(settings), RemotePublisher.from_settings(settings) as remote:
            yield remote
        return
    from agents import faults

    with _local(settings) as api:
        yield _Local(Publisher(api, after_publish=lambda: faults.reached("publish-after-commit")), by)


@click.group()
def publish() -> None:
    """Write-Audit-Publish: audit a staging world against prod, approve, publish atomically once.

    \b
    Example:
      causeway publish audit etl-batch --into prod
      causeway publish approve pl-1a2b3c4d5e6f7a8b --by ana
      causeway publish run pl-1a2b3c4d5e6f7a8b --execute
    """


def _print_record(r: AuditRecord) -> None:
    word = {"eligible": "ELIGIBLE", "blocked": "BLOCKED", "up-to-date": "UP TO DATE"}[str(r.verdict)]
    extra = f" by {', '.join(r.blocked_by)}" if r.blocked_by else ""
    click.echo(f"{word}{extra}: {r.heads.source} -> {r.heads.target}  plan {r.plan_id}")
    for c in r.checks:
        click.echo(f"  [{'ok' if c.ok else 'FAIL':>4}] {c.check:<9} {c.detail}")
    for k in r.observed.conflicts[:20]:
        click.echo(
            f"  ! {k.get('conflict')} {k.get('kind', '')} "
            f"{k.get('type', k.get('table', ''))}/{k.get('pk', k.get('column', ''))}"
        )
    o = r.observed
    _summary(
        "audit",
        [
            ("source", f"{r.heads.source}@{r.heads.source_hash[:16]}"),
            ("target", f"{r.heads.target}@{r.heads.target_hash[:16]}"),
            ("base", r.heads.base[:16]),
            ("path", "fast-forward" if r.fast_forward else "merge"),
            (
                "tables",
                f"added {list(o.tables_added)} updated {list(o.tables_updated)} removed {list(o.tables_removed)}",
            ),
            ("entities", dict(o.entities)),
            ("source commits", o.source_ahead),
        ],
    )


@publish.command("audit")
@click.argument("source")
@click.option("--into", "target", default=None, help="Target world (default: the prod world).")
@click.option(
    "--max-drift",
    type=int,
    default=None,
    help="Most commits the target may be ahead of the base (default: CAUSEWAY_PUBLISH_MAX_DRIFT, 10).",
)
@click.option(
    "--max-tables", type=int, default=None, help="Most tables modified (default: CAUSEWAY_PUBLISH_MAX_TABLES, 25)."
)
@click.option(
    "--max-changed-entities",
    type=int,
    default=None,
    help="Most entities changed (default: CAUSEWAY_PUBLISH_MAX_CHANGED_ENTITIES, none).",
)
@click.option("--by", default="", help="Who runs the audit (recorded; over the API: the token's name).")
@click.option("--json", "as_json", is_flag=True, help="Print the audit record as JSON.")
@click.pass_obj
def audit_cmd(
    settings: Settings,
    source: str,
    target: str | None,
    max_drift: int | None,
    max_tables: int | None,
    max_changed_entities: int | None,
    by: str,
    as_json: bool,
) -> None:
    """Audit SOURCE against TARGET and log the record. Exit 0 eligible, 3 up to date,
    10 blocked by drift, 11 by tables, 12 by entities, 13 by conflicts.

    \b
    Example:
      causeway publish audit etl-batch --into prod --max-drift 5 --json
    """
    with _publisher(settings, by) as p:
        record = p.audit(source, target, max_drift, max_tables, max_changed_entities)
    if as_json:
        _json(record.to_json())
    else:
        _print_record(record)
    raise SystemExit(exit_code(record))


@publish.command("approve")
@click.argument("plan_id")
@click.option("--by", required=True, help="Who approves (recorded in the audit log; over the API: the token's name).")
@click.option("--decline", is_flag=True, help="Decline the plan instead (a later run refuses).")
@click.pass_obj
def approve_cmd(settings: Settings, plan_id: str, by: str, decline: bool) -> None:
    """Sign off an eligible plan (or decline it).

    \b
    Example:
      causeway publish approve pl-1a2b3c4d5e6f7a8b --by ana
    """
    with _publisher(settings, by) as p:
        who = p.approve(plan_id, decline=decline)
    click.echo(f"plan {plan_id} {'declined' if decline else 'approved'} by {who}")


def _print_run(out: RunOutcome, as_json: bool) -> None:
    if as_json:
        _json(out.to_json())
        return
    click.echo(f"{out.outcome}: {out.reason}")
    _summary(
        "run",
        [
            ("plan", out.plan_id),
            ("action", out.action),
            ("path", out.path or "-"),
            ("commit", out.commit or "-"),
            ("verified", out.verified),
            ("source deleted", out.source_deleted),
        ],
    )


@publish.command("run")
@click.argument("plan_id")
@click.option("--strategy", default="NORMAL", help="Merge strategy when the target diverged (see `worlds merge`).")
@click.option("--keep-source", is_flag=True, help="Keep the source branch after publishing.")
@click.option("--execute", is_flag=True, help="Publish for real (the default is a dry run).")
@click.option("--by", default="", help="Who runs the publish (recorded; over the API: the token's name).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_obj
def run_cmd(
    settings: Settings, plan_id: str, strategy: str, keep_source: bool, execute: bool, by: str, as_json: bool
) -> None:
    """Publish an approved plan if both heads are still the audited ones (dry run unless --execute).
    Exit 0 published or planned, 5 refused, 6 failed.

    \b
    Example:
      causeway publish run pl-1a2b3c4d5e6f7a8b --execute
    """
    with _publisher(settings, by) as p:
        out = p.run(plan_id, strategy=strategy, keep_source=keep_source, execute=execute)
    _print_run(out, as_json)
    raise SystemExit({"refused": 5, "failed": 6}.get(out.outcome, 0))


@publish.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def status_cmd(settings: Settings, as_json: bool) -> None:
    """Per source world: last audit, verdict, first seen, staleness, last run outcome.

    \b
    Example:
      causeway publish status --json
    """
    with _publisher(settings) as p:
        states = p.status()
    now = datetime.now(UTC)
    rows = [
        {
            "source": s.source,
            "target": s.target,
            "plan_id": s.last_plan,
            "verdict": s.last_verdict,
            "blocked_by": list(s.blocked_by),
            "drift": s.drift,
            "first_seen": s.first_seen.isoformat(),
            "last_audit": s.last_audit.isoformat(),
            "staleness_seconds": round(s.staleness_seconds(now)),
            "outcome": s.outcome,
        }
        for s in sorted(states.values(), key=lambda s: s.source)
    ]
    if as_json:
        _json(rows)
        return
    if not rows:
        click.echo("no audits yet")
    for r in rows:
        click.echo(
            f"{r['source']:<20} -> {r['target']:<8} {r['verdict']:<10} drift {r['drift']:<3} "
            f"stale {r['staleness_seconds']}s  plan {r['plan_id']}  outcome {r['outcome'] or '-'}"
        )
