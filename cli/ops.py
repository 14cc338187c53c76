"""Operator commands: `causeway replay`, `causeway dlq ...`, `causeway offsets ...`, `causeway rebuild`.

The commands are thin: planning and decisions live in ``ops.replay.plan``, ``ops.redrive.plan``,
``ops.offsets.plan`` and ``ops.rebuild.plan`` (pure), the I/O in ``ops.replay.run``,
``ops.redrive.run``, ``ops.offsets.run`` and ``ops.rebuild.run``. Every command ends with a summary
block meant to be pasted into a ticket.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click
import orjson

from cli.errors import CommandError, Exit, Incomplete
from cli.progress import Progress
from cli.summary import now, summary
from cli.worlds import commit_hash
from streams.security import kafka_client_options
from streams.settings import Settings

REF = re.compile(r"\d+:\d+")


def parse_time(value: str | None) -> int | None:
    """Epoch milliseconds from epoch ms digits or ISO-8601 (naive = UTC)."""
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is neither ISO-8601 nor epoch milliseconds") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


_now = now
_summary = summary


def _topics(settings: Settings, topics: Sequence[str]) -> tuple[str, ...]:
    return tuple(topics) or (settings.objects_topic, settings.links_topic)


# --- replay ----------------------------------------------------------------------------------------


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
@click.option(
    "--wait-parked",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to wait at the end for parked causes.",
)
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
    from ops.replay.plan import ReplayError, ReplaySpec, parse_range
    from ops.replay.run import CheckpointStore, plan, run_replay

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
        from models.worlds import InvalidWorldId, validate_world_id

        try:
            validate_world_id(into_world)
        except InvalidWorldId as exc:
            raise click.BadParameter(str(exc), param_hint="--into-world") from exc
        if as_of:
            fork = _resolve_as_of(settings, source_world, parse_time(as_of))
        elif from_commit:
            from ops.replay.run import expand_commit

            try:
                fork = expand_commit(settings, source_world, from_commit)
            except ReplayError as exc:
                raise click.BadParameter(str(exc), param_hint="--from-commit") from exc
    spec = ReplaySpec(
        topics=_topics(settings, topics),
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
        _summary(
            f"replay {rid} (dry run, {_now()})",
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

    from ops.replay.run import DependencyDown
    from sinks.errors import NessieError
    from worlds.manager import WorldError

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
            raise click.ClickException("interrupted before the replay was planned; nothing was done") from None
        _replay_summary(report, spec)
        raise SystemExit(130) from None
    _replay_summary(report, spec)
    if not report.already_complete and not report.checkpoint.complete:
        raise Incomplete(f"{report.checkpoint.left:,} record(s) left; run the same command to resume")


async def _interrupted_report(settings: Settings, rid: str) -> Any:
    from ops.replay.run import CheckpointStore, ReplayReport

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
    from models.worlds import WorldNaming
    from ops.replay.run import check_target
    from sinks.nessie import NessieClient
    from worlds.manager import WorldManager

    async with NessieClient.from_settings(settings) as nessie:
        manager = WorldManager(nessie, WorldNaming(settings.prod_world, settings.main_branch))
        await check_target(manager, settings, spec, allow_existing=into_existing, allow_prod=confirm_prod)


def _resolve_as_of(settings: Settings, world: str, ms: int | None) -> str:
    from models.worlds import WorldNaming
    from sinks.catalog import NessieCatalog
    from sinks.errors import NessieError

    assert ms is not None
    branch = WorldNaming(settings.prod_world, settings.main_branch).branch(world)
    try:
        return NessieCatalog.from_settings(settings, branch).resolve_timestamp(ms)
    except NessieError as exc:
        raise click.ClickException(f"cannot resolve {branch} as of {_iso(ms)}: {exc}") from exc


def _filters(spec: Any) -> str:
    parts = []
    if spec.worlds:
        parts.append("world=" + ",".join(spec.worlds))
    if spec.types:
        parts.append("type=" + ",".join(spec.types))
    if spec.from_ms or spec.to_ms:
        parts.append(f"time=[{_iso(spec.from_ms)}, {_iso(spec.to_ms)})")
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
    _summary(f"replay {report.replay_id} ({_now()})", rows)
    click.echo("partitions [start, end) and where a new run would resume:")
    for name, (a, b) in sorted(cp.ranges.items()):
        click.echo(f"  {name:<40} {a}..{b}  next {cp.next.get(name, b)}")
    for note in report.notes:
        click.echo(f"note: {note}")


# --- dlq -------------------------------------------------------------------------------------------


def _dlq_filter_options(f: Any) -> Any:
    for opt in reversed(
        (
            click.option("--reason", "reasons", multiple=True, help="Only this reason code (repeatable)."),
            click.option("--topic", "topics", multiple=True, help="Only letters read from this topic (repeatable)."),
            click.option("--world", "worlds", multiple=True, help="Only this world (repeatable)."),
            click.option("--since", default=None, help="First rejected at or after (ISO-8601 or epoch ms)."),
            click.option("--until", default=None, help="First rejected before (ISO-8601 or epoch ms)."),
            click.option("--ref", "refs", multiple=True, help="Only this DLQ position PARTITION:OFFSET (repeatable)."),
            click.option("--event-id", "event_ids", multiple=True, help="Only this event id (repeatable)."),
        )
    ):
        f = opt(f)
    return f


def _dlq_filter(**kw: Any) -> Any:
    from ops.redrive.plan import DlqFilter

    for ref in kw["refs"]:
        if not REF.fullmatch(ref):
            raise click.BadParameter(f"{ref!r} is not a DLQ position PARTITION:OFFSET (e.g. 0:17)", param_hint="--ref")

    return DlqFilter(
        reasons=kw["reasons"],
        topics=kw["topics"],
        worlds=kw["worlds"],
        since_ms=parse_time(kw["since"]),
        until_ms=parse_time(kw["until"]),
        refs=kw["refs"],
        event_ids=kw["event_ids"],
    )


def _read_letters(settings: Settings, flt: Any, label: str) -> tuple[list[Any], int]:
    from ops.redrive.run import read_dlq

    with Progress(label, None, every_s=5.0) as bar:
        return asyncio.run(read_dlq(settings, flt, bar.advance))


@click.group()
def dlq() -> None:
    """Inspect and redrive dead letters (the DLQ topic, CAUSEWAY_DLQ_TOPIC)."""


@dlq.command("list")
@_dlq_filter_options
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(min=0),
    help="Show at most this many, newest last (0: all).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def dlq_list(settings: Settings, limit: int, as_json: bool, **kw: Any) -> None:
    """List dead letters with their reason, origin and world, filtered.

    \b
    Examples:
      causeway dlq list
      causeway dlq list --reason unknown-world --world whatif-7 --since 2026-11-29T00:00:00Z
    """
    letters, scanned = _read_letters(settings, _dlq_filter(**kw), "scan dlq")
    shown = letters[-limit:] if limit else letters
    for r in shown:
        dl = r.letter
        if as_json:
            click.echo(
                orjson.dumps(
                    {
                        "ref": r.ref,
                        "first_seen": _iso(dl.first_seen_ms),
                        "reason": dl.reason,
                        "topic": dl.topic,
                        "partition": dl.partition,
                        "offset": dl.offset,
                        "world_id": dl.world_id,
                        "event_id": dl.event_id,
                        "redrive_count": dl.redrive_count,
                        "copies": list(r.copies),
                    }
                )
            )
        else:
            click.echo(
                f"{r.ref:>8}  {_iso(dl.first_seen_ms)}  {dl.reason:<18} {dl.topic}[{dl.partition}]@{dl.offset}"
                f"  world={dl.world_id or '-'}  event={dl.event_id or '-'}  redrives={dl.redrive_count}"
                + (f"  copies={len(r.copies)}" if r.copies else "")
            )
    if as_json:
        return
    reasons = Counter(r.letter.reason for r in letters)
    _summary(
        f"dlq list {settings.dlq_topic} ({_now()})",
        [
            ("scanned", f"{scanned:,} letter(s)"),
            ("matched", f"{len(letters):,} (shown {len(shown):,})"),
            ("copies", f"{sum(len(r.copies) for r in letters):,} (same origin, dead-lettered again on redelivery)"),
            ("by reason", ", ".join(f"{k}={v}" for k, v in reasons.most_common()) or "-"),
        ],
    )


@dlq.command("show")
@click.argument("ref_or_event_id")
@click.pass_obj
def dlq_show(settings: Settings, ref_or_event_id: str) -> None:
    """Show one dead letter in full: headers, key and value. REF is PARTITION:OFFSET in the DLQ.

    \b
    Examples:
      causeway dlq show 0:17
      causeway dlq show evt-2026-11-29-000123
    """
    from ops.redrive.plan import DlqFilter

    is_ref = ":" in ref_or_event_id and ref_or_event_id.replace(":", "").isdigit()
    flt = DlqFilter(refs=(ref_or_event_id,)) if is_ref else DlqFilter(event_ids=(ref_or_event_id,))
    letters, _ = _read_letters(settings, flt, "scan dlq")
    if not letters:
        raise click.ClickException(f"no dead letter {ref_or_event_id} in {settings.dlq_topic}")
    for r in letters:
        dl = r.letter
        click.echo(f"dead letter {settings.dlq_topic} {r.ref}")
        if r.copies:
            click.echo(f"  copies (same origin, dead-lettered again on redelivery): {', '.join(r.copies)}")
        for k, v in dl.headers():
            click.echo(f"  {k}: {v.decode('utf-8', 'replace')}")
        click.echo(f"  key: {dl.key.decode('utf-8', 'replace') if dl.key is not None else None}")
        try:
            value = orjson.dumps(orjson.loads(dl.value or b"null"), option=orjson.OPT_INDENT_2).decode()
        except orjson.JSONDecodeError:
            value = repr(dl.value[:2000] if dl.value else dl.value)
        click.echo("  value: " + value.replace("\n", "\n  "))


@dlq.command("redrive")
@_dlq_filter_options
@click.option("--all", "all_", is_flag=True, help="Redrive every letter (needed when no filter is given).")
@click.option("--force", is_flag=True, help="Also send letters that still fail validation or whose world is missing.")
@click.option("--again", is_flag=True, help="Also send letters that were redriven before.")
@click.option(
    "--show",
    default=20,
    show_default=True,
    type=click.IntRange(min=0),
    help="List at most this many per-letter decisions.",
)
@click.option("--dry-run", is_flag=True, help="Show the decision for each letter; send nothing.")
@click.pass_obj
def dlq_redrive(settings: Settings, all_: bool, force: bool, again: bool, show: int, dry_run: bool, **kw: Any) -> None:
    """Re-publish dead letters to their original topic, key and headers (+ redrive count).

    Letters that still fail validation are refused unless --force; so are unknown-world letters
    whose world still has no branch, and cause-missing letters whose cause is still nowhere (no
    Redis mark, not in the world branch's event log, not redriven with them). Letters whose event
    is already applied (Redis mark) are skipped and listed: sending them would only make a
    duplicate. Each redriven DLQ record is remembered, so running the command twice sends it once
    (--again overrides). Letters with the same origin (topic, partition, offset) are one letter.
    Exits 3 when any letter was refused (a dry run too: it makes the same checks).

    \b
    Examples:
      causeway dlq redrive --reason unknown-world --world whatif-7 --dry-run
      causeway dlq redrive --reason unknown-world --world whatif-7
      causeway dlq redrive --ref 0:17 --force
    """
    from ops.redrive.run import plan_redrive, send

    started = time.monotonic()
    flt = _dlq_filter(**kw)
    if flt == type(flt)() and not all_:
        raise click.UsageError("give a filter (--reason, --world, --ref, ...) or --all")
    letters, scanned = _read_letters(settings, flt, "scan dlq")
    decisions = asyncio.run(plan_redrive(settings, letters, force=force, again=again))
    listed = [d for d in decisions if dry_run or not d.send]
    for d in listed[:show]:
        dl = d.record.letter
        verb = "would send" if d.send else f"skip ({d.action})"
        click.echo(f"{d.record.ref:>8}  {verb:<28} {dl.reason:<16} {dl.event_id or '-'}  {d.detail}")
    if len(listed) > show:
        click.echo(f"  ... and {len(listed) - show:,} more (--show N lists more)")
    sent = 0
    if not dry_run:
        todo = sum(d.send for d in decisions)
        with Progress("redrive", todo, enabled=todo > 0) as bar:
            sent = asyncio.run(send(settings, decisions, bar.advance))
    actions = Counter(d.action for d in decisions)
    _summary(
        f"dlq redrive {settings.dlq_topic}{' (dry run)' if dry_run else ''} ({_now()})",
        [
            ("scanned", f"{scanned:,} letter(s)"),
            ("matched", f"{len(decisions):,} (+{sum(len(d.record.copies) for d in decisions):,} copies of them)"),
            ("sent" if not dry_run else "would send", f"{actions['redrive'] if dry_run else sent:,}"),
            ("already applied", f"{actions['applied']:,} (skipped: event has a Redis mark)"),
            ("stale", f"{actions['stale']:,} (skipped: older than the stored version; would be dead-lettered again)"),
            ("still invalid", f"{actions['invalid']:,} (refused; --force sends them)"),
            ("world missing", f"{actions['world-missing']:,} (refused; create the world or --force)"),
            ("cause missing", f"{actions['cause-missing']:,} (refused; redrive the cause first or --force)"),
            ("redriven before", f"{actions['already-redriven']:,} (skipped; --again sends them)"),
            ("no origin", f"{actions['no-origin']:,}"),
            ("took", f"{time.monotonic() - started:.1f}s"),
        ],
    )
    refused = sum(actions[a] for a in ("invalid", "world-missing", "cause-missing", "no-origin"))
    if refused:
        raise Incomplete(f"{refused:,} letter(s) refused{' (dry run)' if dry_run else ''}; see the summary")


# --- offsets ---------------------------------------------------------------------------------------


@click.group()
def offsets() -> None:
    """Consumer-group offsets of the workers: lag per partition, and resets."""


def _group_opts(f: Any) -> Any:
    f = click.option("--topic", "topics", multiple=True, help="Topic (repeatable; default: both change topics).")(f)
    return click.option("--group", default=None, help="Consumer group (default: CAUSEWAY_APP_ID).")(f)


@offsets.command("show")
@_group_opts
@click.pass_obj
def offsets_show(settings: Settings, group: str | None, topics: tuple[str, ...]) -> None:
    """Committed offset, log end and lag per partition, and the group's members.

    \b
    Example:
      causeway offsets show --group causeway
    """
    from ops.offsets.run import describe_group, partition_offsets

    group = group or settings.app_id
    state = asyncio.run(describe_group(settings.kafka_bootstrap, group, kafka_client_options(settings)))
    try:
        rows, _ = asyncio.run(
            partition_offsets(
                settings.kafka_bootstrap, group, _topics(settings, topics), kafka_options=kafka_client_options(settings)
            )
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{'topic':<32} {'part':>4} {'committed':>10} {'end':>10} {'lag':>8}")
    for r in rows:
        committed = "-" if r.committed is None else str(r.committed)
        click.echo(f"{r.topic:<32} {r.partition:>4} {committed:>10} {r.end:>10} {r.lag:>8}")
    _summary(
        f"offsets {group} ({_now()})",
        [
            ("group state", f"{state.state}, {len(state.members)} member(s)"),
            ("members", ", ".join(f"{m.client_id}@{m.host}" for m in state.members) or "-"),
            ("total lag", f"{sum(r.lag for r in rows):,} over {len(rows)} partition(s)"),
        ],
    )


@offsets.command("reset")
@_group_opts
@click.option("--to", "strategy", type=click.Choice(["earliest", "latest", "timestamp", "offset"]), required=True)
@click.option("--timestamp", default=None, help="With --to timestamp: ISO-8601 or epoch ms.")
@click.option("--offset", "offset_values", multiple=True, help="With --to offset: N, P:N or TOPIC/P:N (repeatable).")
@click.option("--partition", "partitions", multiple=True, type=int, help="Only this partition (repeatable).")
@click.option("--dry-run", is_flag=True, help="Show the planned offsets; commit nothing.")
@click.pass_obj
def offsets_reset(
    settings: Settings,
    group: str | None,
    topics: tuple[str, ...],
    strategy: str,
    timestamp: str | None,
    offset_values: tuple[str, ...],
    partitions: tuple[int, ...],
    dry_run: bool,
) -> None:
    """Move the group's committed offsets. Refused while the group has active members.

    Stop every worker first (a running one would commit over the reset). Moving back re-reads
    events (dedupe makes that harmless); moving forward SKIPS events: `causeway replay` can apply
    a skipped range later. Running it twice sets the same offsets again.

    \b
    Examples:
      causeway offsets reset --to earliest --dry-run
      causeway offsets reset --to timestamp --timestamp 2026-11-29T08:00:00Z
      causeway offsets reset --to offset --topic onto.changes.objects --offset 0:1200 --offset 1:980

    With --to offset, only the partitions named by --offset move (N alone names them all).
    """
    from ops.offsets.plan import ResetRefused, check_resettable, parse_offset_targets, plan_reset
    from ops.offsets.run import commit_reset, describe_group, partition_offsets

    group = group or settings.app_id
    if strategy == "timestamp" and not timestamp:
        raise click.UsageError("--to timestamp needs --timestamp")
    if strategy == "offset" and not offset_values:
        raise click.UsageError("--to offset needs --offset")
    at_ms = parse_time(timestamp) if strategy == "timestamp" else None
    try:
        state = asyncio.run(describe_group(settings.kafka_bootstrap, group, kafka_client_options(settings)))
        check_resettable(state)
        topic_list = _topics(settings, topics)
        rows, by_time = asyncio.run(
            partition_offsets(settings.kafka_bootstrap, group, topic_list, at_ms, kafka_client_options(settings))
        )
        missing = sorted(set(partitions) - {r.partition for r in rows})
        if missing:
            have = ", ".join(str(p) for p in sorted({r.partition for r in rows}))
            raise click.BadParameter(f"no partition {missing} in {', '.join(topic_list)} (partitions: {have})")
        rows = [r for r in rows if not partitions or r.partition in partitions]
        targets = parse_offset_targets(offset_values, [(r.topic, r.partition) for r in rows]) if offset_values else {}
        if strategy == "offset":
            rows = [r for r in rows if (r.topic, r.partition) in targets]  # only the partitions named
        tps = [(r.topic, r.partition) for r in rows]
        plan = plan_reset(
            strategy,
            tps,
            committed={(r.topic, r.partition): r.committed for r in rows},
            starts={(r.topic, r.partition): r.start for r in rows},
            ends={(r.topic, r.partition): r.end for r in rows},
            by_time=by_time,
            offsets=targets if strategy == "offset" else None,
        )
        click.echo(f"{'topic':<32} {'part':>4} {'current':>10} {'new':>10} {'delta':>8}")
        for p in plan:
            cur = "-" if p.current is None else str(p.current)
            delta = "-" if p.delta is None else f"{p.delta:+d}"
            click.echo(f"{p.topic:<32} {p.partition:>4} {cur:>10} {p.target:>10} {delta:>8}")
        if not dry_run:
            asyncio.run(commit_reset(settings.kafka_bootstrap, group, plan, kafka_client_options(settings)))
    except ResetRefused as exc:
        raise click.ClickException(f"reset refused: {exc}") from exc
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    skipped = sum(p.delta for p in plan if p.delta and p.delta > 0)
    reread = -sum(p.delta for p in plan if p.delta and p.delta < 0)
    _summary(
        f"offsets reset {group}{' (dry run)' if dry_run else ''} ({_now()})",
        [
            ("target", strategy + (f" {_iso(at_ms)}" if at_ms else "")),
            ("group state", f"{state.state}, no active members"),
            ("partitions", f"{len(plan)}"),
            ("moved", f"{sum(1 for p in plan if p.delta != 0):,} partition(s)"),
            ("re-read", f"{reread:,} record(s) (moved back)"),
            ("skipped", f"{skipped:,} record(s) (moved forward; replay can apply them)"),
            ("committed", "no (dry run)" if dry_run else "yes"),
        ],
    )


# --- rebuild ---------------------------------------------------------------------------------------


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
    from models.worlds import InvalidWorldId
    from ops.rebuild.run import RebuildError
    from ops.rebuild.run import rebuild as run_rebuild
    from sinks.errors import NessieError

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
    _summary(
        f"rebuild {world} ({_now()})",
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
