"""``causeway reconcile``: compare control, projection and event-log counts; repair drift.

Exit codes: 0 consistent (nothing found, or everything found repaired or within the threshold);
1 a world failed mid-run; 2 bad usage (bad or unknown world id); 3 dry run found rows a real run
would rebuild; 4 a service is down (checked before the run); 5 drift that a rebuild cannot fix
(control count ≠ event log).
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from typing import Any

import click
import orjson

from streams.settings import Settings


@click.command("reconcile")
@click.option("--world", "worlds", multiple=True, help="World id to reconcile (repeatable).")
@click.option("--all", "all_worlds", is_flag=True, help="Every world branch in Nessie (ignores the scope setting).")
@click.option("--dry-run", is_flag=True, help="Compare and report only; commit nothing, record no metrics.")
@click.option("--threshold", type=int, default=None, help="Override CAUSEWAY_RECONCILE_THRESHOLD for this run.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports and the verdict as JSON.")
@click.pass_obj
def reconcile(
    settings: Settings, worlds: tuple[str, ...], all_worlds: bool, dry_run: bool, threshold: int | None, as_json: bool
) -> None:
    """Reconcile worlds: per object type, compare the control plane's count checkpoint, the live rows of
    entity_common and the event log (rows and their properties); rebuild differing rows from the event
    log in one Nessie commit per world. Running it twice is harmless: the second run finds nothing.

    Without --world or --all it covers the worlds CAUSEWAY_RECONCILE_WORLDS lists (ids or patterns).
    Each run (not --dry-run) is recorded in Redis, where every worker exports it to Prometheus.

    Exit codes: 0 consistent or repaired, 1 failed, 2 bad world, 3 dry run found rows to repair,
    4 a service down, 5 drift a rebuild cannot fix.

    \b
    Example:
      causeway reconcile --world staging --dry-run
      causeway reconcile --all --json
    """
    if threshold is not None:
        settings = settings.replace(reconcile_threshold=threshold)
    code = run_reconcile(settings, worlds, all_worlds=all_worlds, dry_run=dry_run, as_json=as_json)
    click.get_current_context().exit(code)


def _fail(message: str, code: int = 1) -> int:
    click.echo(f"causeway reconcile: {message}", err=True)
    return code


def run_reconcile(
    settings: Settings, worlds: tuple[str, ...], *, all_worlds: bool, dry_run: bool, as_json: bool
) -> int:
    """The command's body; returns the exit code. Expected failures are one line on stderr."""
    from agents.reconcile import Reconciler, publish_runs, read_control_counts
    from agents.reconcile_plan import ScopeError, WorldScope, verdict
    from models.worlds import InvalidWorldId, validate_world_id

    for w in worlds:
        try:
            validate_world_id(w)
        except InvalidWorldId as exc:
            return _fail(f"{w!r} is not a world id: {exc}", 2)
    try:
        scope = WorldScope.parse(settings.reconcile_worlds)
    except ScopeError as exc:
        return _fail(str(exc), 2)
    if not worlds and not all_worlds and scope.empty_without_worker:
        return _fail(
            "say which worlds: --world W (repeatable) or --all; or set CAUSEWAY_RECONCILE_WORLDS to world ids or "
            f"patterns (it is {settings.reconcile_worlds!r}, and 'served' means nothing outside a worker)",
            2,
        )
    rec = Reconciler(settings)
    try:
        existing = rec.worlds()
    except Exception as exc:  # noqa: BLE001 - Nessie down or refusing: one line, not a traceback
        return _fail(f"cannot list worlds in Nessie at {settings.nessie_url}: {_why(exc)}")
    if worlds:
        missing = [w for w in worlds if w not in existing]
        if missing:
            return _fail(
                f"no such world: {', '.join(missing)} (no branch in Nessie); `causeway worlds list` shows them", 2
            )
        targets = list(dict.fromkeys(worlds))
    else:
        targets = existing if all_worlds else scope.select(existing)
    try:
        counts = asyncio.run(read_control_counts(settings))
    except Exception as exc:  # noqa: BLE001 - Kafka down
        return _fail(f"cannot read control counts from Kafka at {settings.kafka_bootstrap}: {_why(exc)}")

    reports = []
    with click.progressbar(targets, label="reconciling", show_pos=True, file=sys.stderr) as bar:
        for world in bar:
            reports.append(rec.check(world, counts.get(world, {}), dry_run=dry_run))
    v = verdict(reports, settings.reconcile_threshold)
    published = None
    if not dry_run:
        try:
            asyncio.run(publish_runs(settings, reports, existing))
            published = True
        except Exception as exc:  # noqa: BLE001 - the run itself is done; say what Prometheus will miss
            published = False
            click.echo(
                f"causeway reconcile: warning: the run is not recorded for Prometheus (Redis at "
                f"{settings.redis_url}: {_why(exc)}); CausewayReconciliationStale may fire",
                err=True,
            )
    if as_json:
        doc = {
            "reports": [r.to_json() for r in reports],
            "summary": dict(v.rows()),
            "exit_code": v.exit_code,
            "recorded_for_prometheus": published,
        }
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return v.exit_code
    for r in reports:
        _echo_report(r, dry_run)
    title = f"reconcile{' (dry run)' if dry_run else ''} ({datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')})"
    rows = v.rows()
    if published is not None:
        rows.insert(-1, ("metrics", "recorded in Redis for Prometheus" if published else "NOT recorded (see above)"))
    click.echo(f"--- {title} ---")
    width = max(len(k) for k, _ in rows)
    for k, val in rows:
        click.echo(f"{k:<{width}}  {val}")
    return v.exit_code


def _echo_report(r: Any, dry_run: bool) -> None:
    head = f"{r.world_id}: {r.outcome}" + (" (dry run)" if dry_run else "")
    if r.commit:
        head += f", commit {r.commit[:12]}"
    click.echo(f"{head} in {r.seconds:.2f}s" + (f": {r.error}" if r.error else ""))
    for t in r.types.values():
        control = "-" if t.control is None else str(t.control)
        action = "would repair" if dry_run else "repaired"
        note = "  cannot repair: control count differs from the event log" if t.unrepairable else ""
        click.echo(
            f"  {t.object_type:24} control {control:>8}  projection {t.projection:>8}  log {t.log:>8}"
            f"  drift {t.drift:>6}" + (f"  {action} {t.repaired}" if t.repaired else "") + note
        )


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
