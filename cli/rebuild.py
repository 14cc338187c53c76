"""`causeway rebuild`: rebuild a world's projections from its event log, diff, swap (``ops.rebuild``).

Every command ends with a summary block meant to be pasted into a ticket.
"""

from __future__ import annotations

import time

import click

from cli.errors import Incomplete
from cli.progress import Progress
from cli.summary import now, summary
from models.worlds import InvalidWorldId
from ops.rebuild.run import RebuildError
from ops.rebuild.run import rebuild as run_rebuild
from sinks.errors import NessieError
from streams.settings import Settings


@click.command()
@click.argument("world")
@click.option("--swap", is_flag=True, help="Move the world's branch to the rebuilt head (refused if it moved).")
@click.option("--sample", default=10, show_default=True, help="Differing keys to show per table.")
@click.option("--dry-run", is_flag=True, help="Rebuild in memory and show the diff; create no branch.")
@click.pass_obj
def rebuild(settings: Settings, world: str, swap: bool, sample: int, dry_run: bool) -> None:
    """Rebuild WORLD's projections from its event log (entity_events), diff, optionally swap.

    For when Kafka's retention has passed: the applied rows of the log are folded (highest
    version per entity wins, DELETE leaves a tombstone, TRUNCATE clears a type) onto a new branch
    rebuild-WORLD-<head> forked from the world's head, in one commit. The diff against the live
    projections is shown; --swap then assigns the world's branch to the rebuilt head, expecting
    the head the rebuild read, so it is refused if a worker committed meanwhile. When the
    projections already equal the rebuild, nothing is written (safe to run twice).

    \b
    Examples:
      causeway rebuild prod --dry-run
      causeway rebuild whatif-q4
      causeway rebuild whatif-q4 --swap
    """

    started = time.monotonic()
    bars: dict[str, Progress] = {}

    def progress(table: str, rows: int, total: int | None) -> None:
        if table not in bars:
            for bar in bars.values():
                bar.finish()
            bars[table] = Progress(f"read {table}", total).__enter__()
        bars[table].advance(rows)

    try:
        click.echo(f"rebuilding world {world} from its event log ...", err=True)
        try:
            result = run_rebuild(settings, world, write=not dry_run, swap=swap and not dry_run, progress=progress)
        finally:
            for bar in bars.values():
                bar.finish()
    except (RebuildError, InvalidWorldId) as exc:
        raise click.ClickException(str(exc)) from exc
    except NessieError as exc:
        raise click.ClickException(f"Nessie at {settings.nessie_url}: {exc}") from exc
    for d in result.diffs:
        click.echo(
            f"{d.table:<14} live {d.live_rows:>8,}  rebuilt {d.rebuilt_rows:>8,}  same {d.same:>8,}  "
            f"-{len(d.only_live):,} +{len(d.only_rebuilt):,} ~{len(d.changed):,}"
        )
        for line in d.sample(sample):
            click.echo(f"    {line}")
    if result.identical:
        outcome = "identical: the live projections equal the rebuild; nothing written"
    elif dry_run:
        outcome = "differs (dry run: no branch created)"
    elif result.swapped:
        outcome = f"swapped: {result.branch} now at {result.rebuild_head[:12] if result.rebuild_head else '?'}"
    else:
        outcome = f"differs; rebuilt on {result.rebuild_branch}; run again with --swap to use it"
    summary(
        f"rebuild {world} ({now()})",
        [
            ("world branch", f"{result.branch} at {result.head[:12]}"),
            ("events folded", f"{result.rebuilt.events_used:,} applied row(s) of entity_events"),
            ("rebuild branch", (result.rebuild_branch or "-") + (" (reused)" if result.reused else "")),
            ("rebuild head", (result.rebuild_head or "-")[:12]),
            ("removed", ", ".join(result.removed) or "- (no stale rebuild branch of an older head)"),
            ("outcome", outcome),
            ("took", f"{time.monotonic() - started:.1f}s"),
        ],
    )
    if not result.identical and not result.swapped:
        raise Incomplete("the live projections differ from the rebuild" + ("" if dry_run else "; --swap uses it"))
