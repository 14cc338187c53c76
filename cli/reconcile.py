"""``causeway reconcile``: compare control, projection and event-log counts; repair drift."""

from __future__ import annotations

import asyncio

import click

from streams.settings import Settings


@click.command("reconcile")
@click.option("--world", "worlds", multiple=True, help="World id to reconcile (repeatable); default: every world.")
@click.option("--dry-run", is_flag=True, help="Compare and report only; commit nothing, record no metrics.")
@click.option("--threshold", type=int, default=None, help="Override CAUSEWAY_RECONCILE_THRESHOLD for this run.")
@click.pass_obj
def reconcile(settings: Settings, worlds: tuple[str, ...], dry_run: bool, threshold: int | None) -> None:
    """Reconcile worlds: per object type, compare the control plane's count checkpoint, the live rows of
    entity_common and the count derived from entity_events; rebuild drifted rows from the event log
    in one Nessie commit per world. Running it twice is harmless: the second run finds nothing.

    \b
    Example:
      causeway reconcile --world staging --dry-run
      causeway reconcile
    """
    from agents.reconcile import Reconciler
    from agents.reconcile import reconcile as run

    if threshold is not None:
        settings = settings.replace(reconcile_threshold=threshold)
    rec = Reconciler(settings)
    targets = list(worlds) or rec.worlds()
    failed = False
    with click.progressbar(targets, label="reconciling", show_pos=True) as bar:
        reports = []
        for world in bar:
            reports += asyncio.run(run(settings, [world], dry_run=dry_run, reconciler=rec))
    for r in reports:
        head = f"{r.world_id}: {r.outcome}" + (" (dry run)" if dry_run else "")
        if r.commit:
            head += f", commit {r.commit[:12]}"
        click.echo(f"{head} in {r.seconds:.2f}s" + (f" — {r.error}" if r.error else ""))
        for t in r.types.values():
            control = "-" if t.control is None else str(t.control)
            action = "would repair" if dry_run else "repaired"
            click.echo(
                f"  {t.object_type:24} control {control:>8}  projection {t.projection:>8}  log {t.log:>8}"
                f"  drift {t.drift:>6}" + (f"  {action} {t.repaired}" if t.repaired else "")
            )
        failed |= r.outcome == "failed"
    if failed:
        raise click.ClickException("some worlds failed to reconcile (see above)")
