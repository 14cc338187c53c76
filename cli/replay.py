"""`causeway replay`: re-read a topic range through the normal applier (planning in ``ops.replay``).

Every command ends with a summary block meant to be pasted into a ticket.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click

from cli.errors import CommandError, Exit, Incomplete
from cli.options import change_topics, iso_ms, not_negative, parse_time
from cli.progress import Progress
from cli.summary import now, summary
from cli.worlds import commit_hash
from models.worlds import InvalidWorldId, WorldNaming, validate_world_id
from ops.replay.plan import ReplayError, ReplaySpec, parse_range
from ops.replay.run import CheckpointStore, DependencyDown, ReplayReport, check_target, expand_commit, plan, run_replay
from sinks.catalog import NessieCatalog
from sinks.errors import NessieError
from sinks.nessie import NessieClient
from streams.settings import Settings
from worlds.manager import WorldError, WorldManager


@click.command()
@click.option("--topic", "topics", multiple=True, help="Topic to re-read (repeatable; default: both change topics).")
@click.option(
    "--range",
    "ranges",
    multiple=True,
    metavar="[TOPIC/]P:START-END",
    help="Offsets of one partition, END exclusive, either side may be empty (repeatable). "
    "Only the named partitions are read when given.",
)
@click.option("--from-time", default=None, help="Window start (ISO-8601 or epoch ms); offsets_for_times per partition.")
@click.option("--to-time", default=None, help="Window end, exclusive (ISO-8601 or epoch ms).")
@click.option("--world", "worlds", multiple=True, help="Only events of this world (repeatable).")
@click.option("--type", "types", multiple=True, help="Only events of this object or link type (repeatable).")
@click.option("--into-world", default=None, help="Replay into a NEW world branch (a what-if world); see below.")
@click.option(
    "--from-commit",
    default=None,
    callback=commit_hash,
    help="With --into-world: fork the new world at this commit hash (a prefix is expanded).",
)
@click.option("--as-of", default=None, help="With --into-world: fork at the source world as of this time.")
@click.option("--restart", is_flag=True, help="Ignore a saved checkpoint and start the range again.")
@click.option(
    "--into-existing", is_flag=True, help="With --into-world: allow a world that already exists (it is written to)."
)
@click.option("--confirm-prod", is_flag=True, help="With --into-world prod --into-existing: yes, the production world.")
@not_negative("--wait-parked", default=5.0, help="Seconds to wait at the end for parked causes.")
@click.option(
    "--max-records",
    "stop_after",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after about N records read (a bounded run); the next run resumes from the checkpoint.",
)
@click.option("--dry-run", is_flag=True, help="Show the resolved ranges and record counts; change nothing.")
@click.pass_obj
def replay(
    settings: Settings,
    topics: tuple[str, ...],
    ranges: tuple[str, ...],
    from_time: str | None,
    to_time: str | None,
    worlds: tuple[str, ...],
    types: tuple[str, ...],
    into_world: str | None,
    from_commit: str | None,
    as_of: str | None,
    restart: bool,
    into_existing: bool,
    confirm_prod: bool,
    wait_parked: float,
    stop_after: int | None,
    dry_run: bool,
) -> None:
    """Re-read a topic range through the normal processing path (dedupe makes it harmless).

    Records are read with a plain consumer (not the worker group, whose offsets stay as they are)
    and go through the same applier as a worker: decode, Redis dedupe, causal gate, one Nessie
    commit per world per flush, marks. Events already applied are counted as duplicates. Invalid
    records are skipped (they were dead-lettered when first read; use `causeway dlq`).

    The replay is checkpointed in Redis under an id derived from the options: running the same
    command again resumes where it stopped, or reports that it is complete (--restart re-reads).

    --into-world NEW replays the events of ONE source world (--world, default prod) into a new
    world branch forked from --from-commit, --as-of or the source world's head: each event keeps
    its event id, version, cause and properties; only world_id (and so the key) becomes NEW.
    Events the fork already holds are marked applied for NEW, so they count as duplicates. A world
    that exists is refused unless --into-existing; prod also needs --confirm-prod.

    The run ends: once the range is read, events whose cause is neither in the range nor on the
    branch are dead-lettered as cause-missing and reported. Exit 0 when complete, 3 when records
    are left (--max-records, parked), 130 on Ctrl-C (the next run resumes).

    \b
    Examples:
      causeway replay --topic onto.changes.objects --range 0:1200-1500 --range 3:-
      causeway replay --from-time 2026-11-29T08:00:00Z --to-time 2026-11-29T09:00:00Z --world prod
      causeway replay --into-world whatif-q4 --world prod --from-commit 8f2c1e0d --to-time 2026-11-01
    """

    if into_world is None and (from_commit or as_of):
        raise click.UsageError("--from-commit and --as-of need --into-world")
    if from_commit and as_of:
        raise click.UsageError("give at most one of --from-commit and --as-of")
    if into_world is not None and len(worlds) > 1:
        raise click.UsageError("--into-world replays one source world: give at most one --world")
    try:
        parsed = tuple(parse_range(r) for r in ranges)
    except ReplayError as exc:
        raise click.BadParameter(str(exc), param_hint="--range") from exc
    fork = from_commit
    source_world = worlds[0] if worlds else settings.prod_world
    if into_world is not None:
        try:
            validate_world_id(into_world)
        except InvalidWorldId as exc:
            raise click.BadParameter(str(exc), param_hint="--into-world") from exc
        if as_of:
            fork = _resolve_as_of(settings, source_world, parse_time(as_of))
        elif from_commit:
            try:
                fork = expand_commit(settings, source_world, from_commit)
            except ReplayError as exc:
                raise click.BadParameter(str(exc), param_hint="--from-commit") from exc
    spec = ReplaySpec(
        topics=change_topics(settings, topics),
        ranges=parsed,
        from_ms=parse_time(from_time),
        to_ms=parse_time(to_time),
        worlds=(source_world,) if into_world else worlds,
        types=types,
        into_world=into_world,
        fork_from=fork,
    )
    rid = spec.replay_id()
    if dry_run:
        try:
            planned = asyncio.run(plan(settings, spec))
            if into_world is not None:  # the checks the real run makes before it creates the world
                asyncio.run(_check_target(settings, spec, into_existing, confirm_prod))
        except ReplayError as exc:
            raise click.ClickException(str(exc)) from exc
        total = sum(b - a for a, b in planned.values())
        for (t, p), (a, b) in sorted(planned.items()):
            click.echo(f"  {t}/{p}: offsets {a}..{b} ({b - a:,} records)")
        summary(
            f"replay {rid} (dry run, {now()})",
            [
                ("would read", f"{total:,} records from {len(planned)} partition(s)"),
                ("filters", _filters(spec)),
                ("into world", _into(spec, None)),
                ("changed", "nothing"),
            ],
        )
        return

    async def main() -> Any:
        store = CheckpointStore.from_settings(settings)
        bar: list[Progress] = []

        def on_start(cp: Any) -> None:
            if not cp.complete:
                bar.append(Progress(f"replay {rid}", cp.left).__enter__())

        try:
            return await run_replay(
                settings,
                spec,
                store=store,
                restart=restart,
                stop_after=stop_after,
                wait_parked_s=wait_parked,
                on_start=on_start,
                progress=lambda n: bar[0].advance(n) if bar else None,
                into_existing=into_existing,
                allow_prod=confirm_prod,
            )
        finally:
            for b in bar:
                b.finish()
            await store.close()

    try:
        report = asyncio.run(main())
    except DependencyDown as exc:
        raise CommandError(str(exc), Exit.UNAVAILABLE) from exc
    except (ReplayError, WorldError) as exc:
        raise click.ClickException(str(exc)) from exc
    except NessieError as exc:
        raise click.ClickException(f"Nessie at {settings.nessie_url}: {exc}") from exc
    except KeyboardInterrupt:
        # The run saved its checkpoint while unwinding; show where the next run resumes.
        report = asyncio.run(_interrupted_report(settings, rid))
        if report is None:
            nothing = "interrupted before the replay was planned; nothing was done"
            raise CommandError(nothing, Exit.INTERRUPTED) from None
        _replay_summary(report, spec)
        raise SystemExit(130) from None
    _replay_summary(report, spec)
    if not report.already_complete and not report.checkpoint.complete:
        raise Incomplete(f"{report.checkpoint.left:,} record(s) left; run the same command to resume")


async def _interrupted_report(settings: Settings, rid: str) -> Any:

    store = CheckpointStore.from_settings(settings)
    try:
        cp = await store.load(rid)
    finally:
        await store.close()
    if cp is None:
        return None
    return ReplayReport(
        rid,
        cp,
        resumed=cp.runs > 1,
        already_complete=False,
        interrupted=True,
        read_this_run=cp.last_run_read,
        seconds=cp.last_run_s,
    )


async def _check_target(settings: Settings, spec: Any, into_existing: bool, confirm_prod: bool) -> None:

    async with NessieClient.from_settings(settings) as nessie:
        manager = WorldManager(nessie, WorldNaming(settings.prod_world, settings.main_branch))
        await check_target(manager, settings, spec, allow_existing=into_existing, allow_prod=confirm_prod)


def _resolve_as_of(settings: Settings, world: str, ms: int | None) -> str:

    assert ms is not None
    branch = WorldNaming(settings.prod_world, settings.main_branch).branch(world)
    try:
        return NessieCatalog.from_settings(settings, branch).resolve_timestamp(ms)
    except NessieError as exc:
        raise click.ClickException(f"cannot resolve {branch} as of {iso_ms(ms)}: {exc}") from exc


def _filters(spec: Any) -> str:
    parts = []
    if spec.worlds:
        parts.append("world=" + ",".join(spec.worlds))
    if spec.types:
        parts.append("type=" + ",".join(spec.types))
    if spec.from_ms or spec.to_ms:
        parts.append(f"time=[{iso_ms(spec.from_ms)}, {iso_ms(spec.to_ms)})")
    return " ".join(parts) or "none"


def _into(spec: Any, fork_hash: str | None) -> str:
    if not spec.into_world:
        return "- (events go to their own worlds)"
    at = fork_hash or spec.fork_from
    return f"{spec.into_world} (forked at {at[:12] if at else 'the source head'})"


def _replay_summary(report: Any, spec: Any) -> None:
    cp = report.checkpoint
    c = cp.counters
    if report.already_complete:
        state = "already complete: nothing read (use --restart to read the range again)"
    elif cp.complete:
        state = "complete"
    elif report.interrupted:
        state = f"stopped early; {cp.left:,} record(s) left, run the same command to resume"
    else:
        state = f"incomplete: {cp.left:,} record(s) left (parked events hold their partitions)"
    rows: list[tuple[str, object]] = [
        ("state", state),
        ("run", f"{cp.runs} ({'resumed from checkpoint' if report.resumed else 'new'})"),
        ("range", f"{cp.total:,} records in {len(cp.ranges)} partition(s)"),
        ("filters", _filters(spec)),
        ("into world", _into(spec, cp.fork_hash) + (" [created]" if report.world_created else "")),
        ("read", f"{c.get('read', 0):,} in total, {report.read_this_run:,} this run"),
        ("applied", f"{c.get('applied', 0):,}"),
        ("duplicates", f"{c.get('duplicates', 0):,} (already applied; dropped)"),
        ("stale", f"{c.get('stale', 0):,} (older than the stored version; dead-lettered)"),
        ("dead-lettered", f"{c.get('dead_lettered', 0):,}"),
        ("filtered out", f"{c.get('filtered_out', 0):,}"),
        ("invalid", f"{c.get('invalid_skipped', 0):,} (skipped; dead-lettered when first read)"),
        ("parked", f"{cp.parked:,}"),
        ("cause missing", f"{report.causes_missing:,} (dead-lettered: cause neither in the range nor on the branch)"),
        ("took", f"{report.seconds:.1f}s"),
    ]
    summary(f"replay {report.replay_id} ({now()})", rows)
    click.echo("partitions [start, end) and where a new run would resume:")
    for name, (a, b) in sorted(cp.ranges.items()):
        click.echo(f"  {name:<40} {a}..{b}  next {cp.next.get(name, b)}")
    for note in report.notes:
        click.echo(f"note: {note}")
