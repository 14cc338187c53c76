"""`causeway worlds history|release|show|audit|diff|rollback`: read and rewind worlds.

The commands join the `worlds` group of ``cli.worlds``; each one is a thin shell over
``worlds.api.Worlds``: parse options, call, print (text with a summary block, or ``--json``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import click
import orjson
import pyarrow as pa

from cli.progress import Progress
from cli.worlds import worlds
from models.worlds import InvalidWorldId
from sinks.errors import NessieError
from streams.settings import Settings
from worlds.api import Worlds, WorldsApi, WorldsError
from worlds.refs import InvalidRef, parse_time

T = TypeVar("T")


@contextmanager
def _errors(settings: Settings) -> Iterator[None]:
    """Every expected failure of the body as one error line and a non-zero exit."""
    try:
        yield
    except (WorldsError, InvalidRef, InvalidWorldId) as exc:
        raise click.ClickException(str(exc)) from exc
    except NessieError as exc:
        raise click.ClickException(f"Nessie at {settings.nessie_url}: {exc}") from exc


@contextmanager
def _local(settings: Settings) -> Iterator[Worlds]:
    """``Worlds`` itself, on Nessie directly (the publish gate runs on it)."""
    with _errors(settings), Worlds.from_settings(settings) as api:
        yield api


@contextmanager
def _api(settings: Settings) -> Iterator[WorldsApi]:
    """The world commands' API: ``Worlds``, or with ``CAUSEWAY_API_URL`` set its twin over the world
    manager API (auth, idempotency, audit log: docs/api.md)."""
    if settings.api_url:
        from api.remote_worlds import RemoteWorlds

        with _errors(settings), RemoteWorlds.from_settings(settings) as twin:
            yield twin
        return
    with _local(settings) as api:
        yield api


def _time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except InvalidRef as exc:
        raise click.BadParameter(str(exc)) from exc


def _target_ref(world: str, to: str) -> str:
    """``--to`` / ``--at``: a commit hash (or its prefix), a time, a release name of WORLD, or a full world ref."""
    if "/" in to or "@" in to:
        return to
    if all(c in "0123456789abcdefABCDEF" for c in to) and len(to) >= 8:
        return f"{world}@{to}"
    try:
        parse_time(to)
    except InvalidRef:
        return f"{world}/{to}"
    return f"{world}@{to}"


def _json(obj: Any) -> None:
    click.echo(orjson.dumps(obj, default=str, option=orjson.OPT_NON_STR_KEYS))


def _summary(title: str, rows: list[tuple[str, Any]]) -> None:
    click.echo("")
    click.echo(title)
    width = max((len(k) for k, _ in rows), default=0)
    for key, value in rows:
        click.echo(f"  {key:<{width}}  {value}")


def _rows(table: pa.Table, columns: list[str]) -> list[dict[str, Any]]:
    present = [c for c in columns if c in table.column_names]
    return table.select(present).to_pylist() if table.num_rows else []


# --- history ---------------------------------------------------------------------------------------


@worlds.command()
@click.argument("world")
@click.option("--since", default=None, help="Only commits at or after this time (ISO-8601 or epoch ms).")
@click.option("--until", default=None, help="Only commits at or before this time.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1), help="At most N commits.")
@click.option("--author", default=None, help="Only commits by this author.")
@click.option("--no-counts", is_flag=True, help="Skip per-table row counts (reads no table metadata).")
@click.option(
    "--changes",
    is_flag=True,
    help="Also count events per kind and change type of older commits that lack them (reads their log files).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per commit.")
@click.pass_obj
def history(
    settings: Settings,
    world: str,
    since: str | None,
    until: str | None,
    limit: int,
    author: str | None,
    no_counts: bool,
    changes: bool,
    as_json: bool,
) -> None:
    """WORLD's commits, newest first: hash, time, author, message, batch id, rows per table.

    \b
    Example:
      causeway worlds history whatif-001 --since 2026-11-30T10:00:00Z --limit 20
      causeway worlds history prod --limit 5 --changes --json
    """
    kinds: dict[str, int] = {}
    n = 0
    with _api(settings) as api, Progress("history", limit, enabled=not as_json) as progress:
        for rec in api.history(
            world,
            since=_time(since),
            until=_time(until),
            author=author,
            limit=limit,
            counts=not no_counts,
            changes=changes,
        ):
            n += 1
            kinds[rec.kind] = kinds.get(rec.kind, 0) + 1
            progress.advance()
            if as_json:
                _json(rec.to_json())
                continue
            counts = "  ".join(
                f"{name} +{c.added_rows}/-{c.removed_rows}"
                for name, c in sorted(rec.tables.items())
                if c.added_rows or c.removed_rows
            )
            batch = f" batch={','.join(rec.batch_ids)}" if rec.batch_ids else ""
            events = f" events={rec.event_count}" if rec.event_count is not None else ""
            click.echo(
                f"{rec.hash[:16]}  {rec.time.isoformat(timespec='seconds')}  "
                f"{rec.author:10} {rec.kind:8}{batch}{events}"
            )
            click.echo(f"    {rec.message}")
            if counts:
                click.echo(f"    {counts}")
            if rec.changes:
                per = "  ".join(
                    f"{kind} " + ",".join(f"{c}={n}" for c, n in sorted(v.items()))
                    for kind, v in sorted(rec.changes.items())
                )
                click.echo(f"    {per}")
    if not as_json:
        _summary(
            f"history of {world}",
            [("commits", n), ("kinds", ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())) or "-")],
        )


# --- releases --------------------------------------------------------------------------------------


@worlds.group()
def release() -> None:
    """Releases: immutable, named states of a world (Nessie tags release/WORLD/NAME).

    A release is a world ref (WORLD/NAME) for `diff`, `show` and `rollback --to`, and a fork
    source: `causeway worlds create X --from-tag release/WORLD/NAME`.
    """


def _release_line(r: Any) -> str:
    when = r.created_at.isoformat(timespec="seconds") if r.created_at else "?"
    msg = f"  {r.message}" if r.message else ""
    return f"{r.world}/{r.name:20} {r.released_hash[:16]}  {when}{msg}"


@release.command("create")
@click.argument("world")
@click.argument("name")
@click.option("-m", "--message", default="", help="What this release is.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def release_create(settings: Settings, world: str, name: str, message: str, as_json: bool) -> None:
    """Release WORLD's current state as NAME. Re-creating a name at another state is refused.

    \b
    Example:
      causeway worlds release create prod q4-2026 -m "Q4 report"
    """
    with _api(settings) as api:
        rel, created = api.create_release(world, name, message)
    if as_json:
        _json(rel.to_json() | {"created": created})
        return
    click.echo(("created " if created else "already exists: ") + _release_line(rel))


@release.command("list")
@click.argument("world", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def release_list(settings: Settings, world: str | None, as_json: bool) -> None:
    """List releases (of WORLD, or of every world).

    \b
    Example:
      causeway worlds release list prod
    """
    with _api(settings) as api:
        found = api.list_releases(world)
    for r in found:
        _json(r.to_json()) if as_json else click.echo(_release_line(r))
    if not as_json:
        click.echo(f"{len(found)} release(s)")


@release.command("show")
@click.argument("world")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def release_show(settings: Settings, world: str, name: str, as_json: bool) -> None:
    """Show one release: the state it holds, when and why it was made.

    \b
    Example:
      causeway worlds release show prod q4-2026
    """
    with _api(settings) as api:
        rel = api.get_release(world, name)
    if as_json:
        _json(rel.to_json())
        return
    _summary(
        f"release {world}/{name}",
        [
            ("tag", rel.tag),
            ("state", rel.released_hash),
            ("commit", rel.hash),
            ("created", rel.created_at.isoformat() if rel.created_at else "?"),
            ("message", rel.message or "-"),
        ],
    )


@release.command("delete")
@click.argument("world")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def release_delete(settings: Settings, world: str, name: str, yes: bool) -> None:
    """Delete a release (its commits stay in the world's history).

    \b
    Example:
      causeway worlds release delete prod q4-2026 --yes
    """
    if not yes:
        click.confirm(f"Delete release {world}/{name}?", abort=True)
    with _api(settings) as api:
        rel = api.delete_release(world, name)
    click.echo(f"deleted release {world}/{name} (was {rel.released_hash[:16]})")


# --- time travel -----------------------------------------------------------------------------------

_OBJECT_COLUMNS = ["object_type_id", "object_pk", "version", "deleted", "properties", "updated_at", "event_id"]
_LINK_COLUMNS = ["link_type", "link_pk", "from_pk", "to_pk", "version", "deleted", "properties", "updated_at"]


@worlds.command()
@click.argument("world")
@click.option("--at", "at", default=None, help="A commit hash (or its prefix), a time or a release; default: head.")
@click.option("--type", "entity_type", default=None, help="Only this object or link type.")
@click.option("--pk", default=None, help="Only this object or link pk.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=0), help="Rows printed per table.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
@click.pass_obj
def show(
    settings: Settings, world: str, at: str | None, entity_type: str | None, pk: str | None, limit: int, as_json: bool
) -> None:
    """Read WORLD as it was at a commit or a time (or a release: WORLD/NAME).

    A time resolves to the last commit at or before it; the commit used is printed.

    \b
    Examples:
      causeway worlds show whatif-001 --at 2026-11-30T14:00:00Z --type person --pk p-17
      causeway worlds show whatif-001 --at 3f2a9c1e0b7d4a55
    """
    ref = world if at is None or "/" in world else _target_ref(world, at)
    with _api(settings) as api:
        snap = api.show(ref, entity_type=entity_type, pk=pk)
    objects, links = _rows(snap.objects, _OBJECT_COLUMNS), _rows(snap.links, _LINK_COLUMNS)
    if as_json:
        for row in objects:
            _json({"kind": "object", **row})
        for row in links:
            _json({"kind": "link", **row})
        return
    click.echo(f"read at {snap.resolved.describe()}")
    for row in objects[:limit]:
        click.echo(f"object {row['object_type_id']}/{row['object_pk']} v{row['version']} {row['properties']}")
    for row in links[:limit]:
        click.echo(
            f"link   {row['link_type']}/{row['link_pk']} {row['from_pk']}->{row['to_pk']} "
            f"v{row['version']} {row['properties']}"
        )
    _summary(
        f"{world} at {snap.resolved.hash[:16]}",
        [("commit", snap.resolved.hash), ("objects", len(objects)), ("links", len(links))],
    )


def _call(settings: Settings, action: Callable[[WorldsApi], T]) -> T:
    with _api(settings) as api:
        return action(api)


# --- audit trail -----------------------------------------------------------------------------------


@worlds.command()
@click.argument("world")
@click.option("--type", "entity_type", required=True, help="The object type (or link type with --link).")
@click.option("--pk", required=True, help="The object pk (or link pk with --link).")
@click.option("--link", "is_link", is_flag=True, help="Audit a link instead of an object.")
@click.option("--since", default=None, help="Only changes committed at or after this time.")
@click.option("--until", default=None, help="Only changes committed at or before this time.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per change.")
@click.pass_obj
def audit(
    settings: Settings,
    world: str,
    entity_type: str,
    pk: str,
    is_link: bool,
    since: str | None,
    until: str | None,
    as_json: bool,
) -> None:
    """Every change of one entity of WORLD, in order: change, version, properties before and after,
    caused_by chain, event id, commit and source.

    WORLD may be any world ref (WORLD@HASH, WORLD@TIME, WORLD/RELEASE) to audit up to that state.

    \b
    Example:
      causeway worlds audit prod --type person --pk p-17 --since 2026-11-01T00:00:00Z
    """
    kind = "link" if is_link else "object"
    entries = _call(
        settings,
        lambda api: api.audit(world, entity_type, pk, kind=kind, since=_time(since), until=_time(until)),
    )
    if as_json:
        for e in entries:
            _json(e.to_json())
        return
    for e in entries:
        commit = e.commit_hash[:16] if e.commit_hash else "?"
        flag = "" if e.applied else "  (stale: not applied)"
        click.echo(f"{e.committed_at.isoformat(timespec='seconds')}  {commit}  {e.change_type:8} v{e.version}{flag}")
        click.echo(f"    event {e.event_id}  batch {e.batch_id}  source {e.source or '-'}")
        if e.caused_by:
            click.echo(f"    caused by {' <- '.join(e.caused_by)}")
        click.echo(f"    before {orjson.dumps(e.before).decode()}  after {orjson.dumps(e.after).decode()}")
    _summary(
        f"audit of {kind} {entity_type}/{pk} in {world}",
        [("changes", len(entries)), ("applied", sum(e.applied for e in entries))],
    )


# --- diff ------------------------------------------------------------------------------------------


@worlds.command()
@click.argument("a")
@click.argument("b")
@click.option("--type", "entity_type", default=None, help="Only changes of this object or link type.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=0), help="Changes printed.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per change, then a summary object.")
@click.pass_obj
def diff(settings: Settings, a: str, b: str, entity_type: str | None, limit: int, as_json: bool) -> None:
    """What changed from world ref A to world ref B: entities added, removed and modified (with
    each changed property's two values), per type, and schema changes.

    A ref is WORLD, WORLD@HASH, WORLD@TIME or WORLD/RELEASE. Only the data files that differ
    between the two states are read.

    \b
    Examples:
      causeway worlds diff prod whatif-001
      causeway worlds diff prod/q3-2026 prod --type person
    """
    with _api(settings) as api, Progress("diff files", None, enabled=not as_json) as progress:
        result = api.diff(a, b, progress=progress.advance)
    changes = [c for c in result.changes if entity_type is None or c.entity_type == entity_type]
    schema = [(t.table, s) for t in result.tables for s in t.schema] + [
        ("entity_events", s) for s in result.events_schema
    ]
    stats = {t.table: t.stats() for t in result.tables}
    if as_json:
        for c in changes:
            _json(c.to_json())
        _json(
            {
                "summary": {
                    "a": result.a.hash,
                    "b": result.b.hash,
                    "counts": result.counts(),
                    "schema": [
                        {"table": t, "change": s.change, "column": s.column, "detail": s.detail} for t, s in schema
                    ],
                    "stats": stats,
                }
            }
        )
        return
    click.echo(f"A: {result.a.describe()}")
    click.echo(f"B: {result.b.describe()}")
    sign = {"added": "+", "removed": "-", "modified": "~"}
    for c in changes[:limit]:
        click.echo(f"{sign[c.change]} {c.kind} {c.entity_type}/{c.pk}")
        for p in c.properties:
            click.echo(f"    {p.name}: {orjson.dumps(p.before).decode()} -> {orjson.dumps(p.after).decode()}")
    if len(changes) > limit:
        click.echo(f"... {len(changes) - limit} more (use --json for all)")
    for table, s in schema:
        click.echo(f"schema {table}: {s.change} {s.column} {s.detail}".rstrip())
    rows: list[tuple[str, Any]] = []
    for kind, per_type in result.counts().items():
        for typ, n in sorted(per_type.items()):
            if entity_type is None or typ == entity_type:
                rows.append((f"{kind} {typ}", f"+{n['added']} -{n['removed']} ~{n['modified']}"))
    for table, st in stats.items():
        rows.append(
            (
                f"read {table}",
                f"{st['data_files_read']} data files ({st['data_files_skipped']} shared, skipped), "
                f"{st['delete_files_read']} delete files, {st['bytes_read']:,} bytes",
            )
        )
    _summary(f"diff {a} -> {b}", rows or [("changes", 0)])


# --- rollback --------------------------------------------------------------------------------------


@worlds.command()
@click.argument("world")
@click.option("--to", "to", required=True, help="A commit hash of WORLD, a release name, or a world ref.")
@click.option("--dry-run", is_flag=True, help="Show what would be rolled back; write nothing.")
@click.option(
    "--force",
    is_flag=True,
    help="If the branch moves meanwhile, plan again from the new head (up to CAUSEWAY_COMMIT_RETRIES times).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def rollback(settings: Settings, world: str, to: str, dry_run: bool, force: bool, yes: bool, as_json: bool) -> None:
    """Make WORLD's tables equal to those at a past commit or release, as a NEW commit.

    History is kept (nothing is force-reset); the commit records the rolled-back range. Offsets
    the world recorded and Redis marks are kept, so Kafka redelivery does not re-apply the
    rolled-back events; `causeway replay --into-world` can re-apply them on purpose.
    If a writer commits to WORLD meanwhile, the rollback is refused (planned again from the new
    head with --force, up to CAUSEWAY_COMMIT_RETRIES times).

    \b
    Examples:
      causeway worlds rollback whatif-001 --to 3f2a9c1e0b7d4a55 --dry-run
      causeway worlds rollback prod --to q3-2026 --yes
    """
    ref = _target_ref(world, to)
    plan = _call(settings, lambda api: api.plan_rollback(world, ref))
    summary = {
        "world": world,
        "branch": plan.branch,
        "head": plan.head,
        "target": plan.target,
        "commits_rolled_back": len(plan.rolled_back),
        "batches_rolled_back": list(plan.batch_ids),
        "tables": {a.table: a.action for a in plan.actions},
    }
    if dry_run or plan.noop:
        if as_json:
            _json(summary | {"dry_run": dry_run, "commit": None})
        else:
            verb = "would roll back" if not plan.noop else "nothing to roll back:"
            click.echo(f"{verb} world {world} from {plan.head[:16]} to {plan.target[:16]}")
            _summary("rollback plan", [(k, v) for k, v in summary.items() if k != "batches_rolled_back"])
        return
    if not yes and not as_json:
        click.confirm(
            f"Roll back world {world} to {plan.target[:16]} ({len(plan.rolled_back)} commit(s) since)?", abort=True
        )
    outcome = _call(settings, lambda api: api.rollback(world, ref, force=force))
    if as_json:
        _json(summary | {"dry_run": False, "commit": outcome.hash, "attempts": outcome.attempts})
        return
    click.echo(f"rolled back world {world} to {outcome.plan.target[:16]} in commit {outcome.hash}")
    _summary(
        "rollback",
        [
            ("commit", outcome.hash),
            ("head was", outcome.plan.head),
            ("commits rolled back", len(outcome.plan.rolled_back)),
            ("tables", ", ".join(f"{a.table}={a.action}" for a in outcome.plan.actions)),
            ("attempts", outcome.attempts),
        ],
    )
