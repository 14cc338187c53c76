"""`causeway offsets show|reset`: the workers' consumer-group lag and offset resets (``ops.offsets``).

Every command ends with a summary block meant to be pasted into a ticket.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click

from cli.options import change_topics, iso_ms, parse_time
from cli.summary import now, summary
from ops.offsets.plan import ResetRefused, check_resettable, parse_offset_targets, plan_reset
from ops.offsets.run import commit_reset, describe_group, partition_offsets
from streams.security import kafka_client_options
from streams.settings import Settings


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

    group = group or settings.app_id
    state = asyncio.run(describe_group(settings.kafka_bootstrap, group, kafka_client_options(settings)))
    try:
        rows, _ = asyncio.run(
            partition_offsets(
                settings.kafka_bootstrap,
                group,
                change_topics(settings, topics),
                kafka_options=kafka_client_options(settings),
            )
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{'topic':<32} {'part':>4} {'committed':>10} {'end':>10} {'lag':>8}")
    for r in rows:
        committed = "-" if r.committed is None else str(r.committed)
        click.echo(f"{r.topic:<32} {r.partition:>4} {committed:>10} {r.end:>10} {r.lag:>8}")
    summary(
        f"offsets {group} ({now()})",
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

    group = group or settings.app_id
    if strategy == "timestamp" and not timestamp:
        raise click.UsageError("--to timestamp needs --timestamp")
    if strategy == "offset" and not offset_values:
        raise click.UsageError("--to offset needs --offset")
    at_ms = parse_time(timestamp) if strategy == "timestamp" else None
    try:
        state = asyncio.run(describe_group(settings.kafka_bootstrap, group, kafka_client_options(settings)))
        check_resettable(state)
        topic_list = change_topics(settings, topics)
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
    summary(
        f"offsets reset {group}{' (dry run)' if dry_run else ''} ({now()})",
        [
            ("target", strategy + (f" {iso_ms(at_ms)}" if at_ms else "")),
            ("group state", f"{state.state}, no active members"),
            ("partitions", f"{len(plan)}"),
            ("moved", f"{sum(1 for p in plan if p.delta != 0):,} partition(s)"),
            ("re-read", f"{reread:,} record(s) (moved back)"),
            ("skipped", f"{skipped:,} record(s) (moved forward; replay can apply them)"),
            ("committed", "no (dry run)" if dry_run else "yes"),
        ],
    )
