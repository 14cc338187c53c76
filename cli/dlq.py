"""`causeway dlq list|show|redrive`: inspect and redrive dead letters (decisions and I/O in ``ops.redrive``).

Every command ends with a summary block meant to be pasted into a ticket.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from typing import Any

import click
import orjson

from cli.errors import Incomplete
from cli.options import iso_ms, not_negative, parse_time
from cli.progress import Progress
from cli.summary import now, summary
from ops.redrive.plan import DlqFilter
from ops.redrive.run import plan_redrive, read_dlq, send
from streams.settings import Settings

REF = re.compile(r"\d+:\d+")


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

    with Progress(label, None, every_s=5.0) as bar:
        return asyncio.run(read_dlq(settings, flt, bar.advance))


@click.group()
def dlq() -> None:
    """Inspect and redrive dead letters (the DLQ topic, CAUSEWAY_DLQ_TOPIC)."""


@dlq.command("list")
@_dlq_filter_options
@not_negative("--limit", default=50, help="Show at most this many, newest last (0: all).")
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
                        "first_seen": iso_ms(dl.first_seen_ms),
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
                f"{r.ref:>8}  {iso_ms(dl.first_seen_ms)}  {dl.reason:<18} {dl.topic}[{dl.partition}]@{dl.offset}"
                f"  world={dl.world_id or '-'}  event={dl.event_id or '-'}  redrives={dl.redrive_count}"
                + (f"  copies={len(r.copies)}" if r.copies else "")
            )
    if as_json:
        return
    reasons = Counter(r.letter.reason for r in letters)
    summary(
        f"dlq list {settings.dlq_topic} ({now()})",
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
@not_negative("--show", default=20, help="List at most this many per-letter decisions.")
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
    summary(
        f"dlq redrive {settings.dlq_topic}{' (dry run)' if dry_run else ''} ({now()})",
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
