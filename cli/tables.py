"""`causeway tables ...`: show a world's tables (layout, files, rows) and evolve their layout."""

from __future__ import annotations

import click
import orjson

from models.worlds import InvalidWorldId
from sinks.errors import NessieError
from sinks.layout import LayoutError, format_sort, format_spec
from sinks.layout_run import EvolveResult, TableLayoutError, TableLayouts, TableMissing, TableReport
from sinks.tables import ALL_TABLES
from streams.settings import Settings


def _layouts(settings: Settings) -> TableLayouts:
    return TableLayouts(settings)


def _fail(settings: Settings, exc: Exception) -> click.ClickException:
    if isinstance(exc, NessieError):
        return click.ClickException(f"Nessie at {settings.nessie_url}: {exc}")
    return click.ClickException(str(exc))


@click.group()
def tables() -> None:
    """Inspect and evolve the Iceberg tables of a world (entity_events, entity_common, entity_edge)."""


@tables.command()
@click.argument("world")
@click.argument("table", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per table.")
@click.option("--partitions", "max_partitions", default=20, show_default=True, help="Partitions listed per table.")
@click.pass_obj
def show(settings: Settings, world: str, table: str | None, as_json: bool, max_partitions: int) -> None:
    """Show WORLD's tables (or one TABLE): schema, partition spec history, sort order, snapshot
    count, and data files, rows and delete files per partition, read at the branch head.

    \b
    Examples:
      causeway tables show prod
      causeway tables show whatif-001 entity_events --json
    """
    try:
        reports = _layouts(settings).show(world, [table] if table else None)
    except (TableLayoutError, InvalidWorldId, NessieError) as exc:
        raise _fail(settings, exc) from exc
    if not reports:
        click.echo(f"world {world} has no tables yet (they are created by its first commit)")
        return
    for report in reports:
        if as_json:
            click.echo(orjson.dumps(report.as_json()))
        else:
            _print_report(report, max_partitions)


def _print_report(r: TableReport, max_partitions: int) -> None:
    click.echo(f"== {r.table} (world {r.world}, branch {r.branch})")
    current = next((s["spec"] for s in r.specs if s["default"]), "")
    for spec in r.specs:
        mark = "  (current)" if spec["default"] else ""
        if not spec["default"] and spec["spec"] == "none" and "bucket(" not in current and current != "none":
            # sinks.layout.writes_one_file: why a type-partitioned table holds unpartitioned files
            mark = "  (small flushes of several partitions; merged into the current spec)"
        click.echo(f"spec {spec['spec_id']}: {spec['spec']}{mark}")
    click.echo(f"sort order: {r.sort_order}")
    click.echo(
        f"snapshots: {r.snapshots}   data files: {r.data_files}   rows: {r.rows:,}   "
        f"delete files: {r.delete_files} ({r.deleted_rows:,} rows deleted)   live rows: {r.rows - r.deleted_rows:,}"
    )
    click.echo(f"gc.enabled: {r.properties.get('gc.enabled', '(unset: engines may delete shared files)')}")
    click.echo("schema: " + ", ".join(f"{c['name']} {c['type']}" + ("" if c["required"] else "?") for c in r.schema))
    if r.partitions:
        click.echo(f"{'partition':48} {'spec':>4} {'files':>6} {'rows':>10} {'del files':>9} {'del rows':>9}")
        for p in r.partitions[:max_partitions]:
            click.echo(
                f"{p.partition[:48]:48} {p.spec_id:>4} {p.data_files:>6} {p.rows:>10,} {p.delete_files:>9} "
                f"{p.deleted_rows:>9,}"
            )
        if len(r.partitions) > max_partitions:
            click.echo(f"... and {len(r.partitions) - max_partitions} more partition(s) (--partitions N, or --json)")
    click.echo("")


@tables.command()
@click.argument("world")
@click.argument("table")
@click.option("--spec", default=None, help="New partition spec, e.g. 'day(occurred_at)', 'none', 'default'.")
@click.option("--sort", default=None, help="New sort order: comma-separated columns, 'none' or 'default'.")
@click.option("--dry-run", is_flag=True, help="Show the old and new layout, change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.pass_obj
def evolve(
    settings: Settings, world: str, table: str, spec: str | None, sort: str | None, dry_run: bool, as_json: bool
) -> None:
    """Evolve TABLE's partition spec and/or sort order on WORLD's branch, in one Nessie commit
    per table (TABLE 'all': each of the three tables, e.g. to migrate a world to the defaults).

    Iceberg partition evolution: files already written keep their spec, new writes use the new
    one, reads and projections stay correct across the change; nothing is rewritten. Also sets
    gc.enabled=false when it is missing. Safe to run twice (the second run has nothing to do).

    \b
    Examples:
      causeway tables evolve prod all --spec default --sort default --dry-run
      causeway tables evolve prod entity_common --spec default --dry-run
      causeway tables evolve prod entity_common --spec 'identity(object_type_id), bucket(32, object_pk)'
      causeway tables evolve whatif-001 entity_events --spec 'day(occurred_at)' --sort default
    """
    if spec is None and sort is None:
        raise click.UsageError("give --spec and/or --sort (use 'default' for the standard layout)")
    names = [t.name for t in ALL_TABLES] if table == "all" else [table]
    layouts = _layouts(settings)
    for name in names:
        try:
            result = layouts.evolve_text(world, name, spec, sort, dry_run=dry_run)
        except TableMissing as exc:
            if table != "all":
                raise _fail(settings, exc) from exc
            click.echo(f"{exc}: skipped")
            continue
        except (LayoutError, TableLayoutError, InvalidWorldId, NessieError) as exc:
            raise _fail(settings, exc) from exc
        if as_json:
            click.echo(orjson.dumps(_result_json(result)))
        else:
            _print_result(result, dry_run)


def _print_result(result: EvolveResult, dry_run: bool) -> None:
    evo = result.evolution
    click.echo(f"table {result.table} of world {result.world} (branch {result.branch})")
    click.echo(f"  spec: {format_spec(evo.old.spec)}  ->  {format_spec(evo.new.spec)}")
    click.echo(f"  sort: {format_sort(evo.old.sort)}  ->  {format_sort(evo.new.sort)}")
    for k, v in result.properties_set.items():
        click.echo(f"  property {k} = {v}")
    for c in result.columns_added:
        click.echo(f"  add column {c}")
    if not result.changed:
        click.echo("nothing to do: the table already has this layout")
    elif dry_run:
        click.echo("dry run: nothing committed")
    else:
        click.echo(f"committed {result.commit} (expected head {str(result.base)[:16]}, attempt {result.attempts})")


def _result_json(r: EvolveResult) -> dict[str, object]:
    evo = r.evolution
    return {
        "world": r.world,
        "branch": r.branch,
        "table": r.table,
        "old": {"spec": format_spec(evo.old.spec), "sort": format_sort(evo.old.sort)},
        "new": {"spec": format_spec(evo.new.spec), "sort": format_sort(evo.new.sort)},
        "removed_fields": [str(f) for f in evo.remove],
        "added_fields": [str(f) for f in evo.add],
        "properties_set": dict(r.properties_set),
        "columns_added": list(r.columns_added),
        "changed": r.changed,
        "dry_run": r.dry_run,
        "commit": r.commit,
    }
