"""`causeway gc`: delete warehouse files no live commit of any branch or tag needs (mark and sweep)."""

from __future__ import annotations

import click
import orjson

from cli.progress import Progress
from sinks.errors import NessieError
from streams.settings import Settings
from worlds.gc import GcError, parse_duration
from worlds.gc_run import run_gc


@click.command()
@click.option(
    "--older-than",
    default="7d",
    show_default=True,
    help="Retention and grace: commits newer than this stay live; only files older than this are deleted.",
)
@click.option(
    "--dry-run", is_flag=True, help="List the files a real run would delete (and their size); delete nothing."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the file list and the totals.")
@click.option("--list/--no-list", "list_files", default=True, help="Print each file (text output).")
@click.pass_obj
def gc(settings: Settings, older_than: str, dry_run: bool, as_json: bool, list_files: bool) -> None:
    """Garbage-collect the warehouse: mark the files every branch and tag needs (heads, and every
    commit within the retention), then delete the other files older than the retention.

    Files referenced by any world, release or commit within the retention are never deleted.

    \b
    Examples:
      causeway gc --older-than 7d --dry-run
      causeway gc --older-than 14d
    """
    try:
        age = parse_duration(older_than)
    except GcError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from exc
    try:
        with Progress("gc references", None, enabled=not as_json) as progress:
            out = run_gc(settings, age, dry_run=dry_run, progress=progress.advance)
    except NessieError as exc:
        raise click.ClickException(f"Nessie at {settings.nessie_url}: {exc}") from exc
    except OSError as exc:
        raise click.ClickException(f"warehouse {settings.warehouse}: {exc}") from exc
    if as_json:
        click.echo(orjson.dumps(out.to_json()))
        return
    if list_files:
        for f in out.plan.delete:
            click.echo(f"{'would delete' if dry_run else 'deleted'} {f.size:>12,}  {f.path}")
    click.echo("")
    click.echo("gc dry run (nothing deleted)" if dry_run else "gc")
    rows = [
        ("warehouse", out.warehouse),
        ("cutoff", out.cutoff.isoformat(timespec="seconds")),
        ("references marked", out.mark.references),
        ("live files", out.live_files),
        ("files to delete" if dry_run else "files deleted", len(out.plan.delete) if dry_run else len(out.deleted)),
        ("bytes" if dry_run else "bytes freed", f"{out.plan.bytes if dry_run else out.freed_bytes:,}"),
        ("kept (not live, younger than cutoff)", out.plan.kept_young),
    ]
    if out.mark.missing:
        rows.append(("live metadata files missing", len(out.mark.missing)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"  {key:<{width}}  {value}")
