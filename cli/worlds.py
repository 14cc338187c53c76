"""`causeway worlds ...`: create, fork, list and delete worlds (Nessie branches)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
import orjson

from cli.errors import mask_url
from cli.summary import now, summary
from models.worlds import InvalidWorldId, WorldNaming
from sinks.errors import NessieError
from sinks.nessie import NessieClient
from streams.settings import Settings
from worlds.manager import ForkSource, WorldError, WorldManager

T = TypeVar("T")
HASH = re.compile(r"[0-9a-fA-F]{8,64}")


def _run(settings: Settings, action: Callable[[WorldManager], Awaitable[T]]) -> T:
    async def main() -> T:
        if settings.api_url:  # through the world manager API (auth, idempotency, audit log): docs/api.md
            from api.remote import RemoteWorldManager

            with RemoteWorldManager.from_settings(settings) as remote:
                return await action(remote)  # type: ignore[arg-type]
        async with NessieClient.from_settings(settings) as nessie:
            manager = WorldManager(nessie, WorldNaming(settings.prod_world, settings.main_branch))
            return await action(manager)

    try:
        return asyncio.run(main())
    except (WorldError, InvalidWorldId) as exc:
        raise click.ClickException(str(exc)) from exc
    except NessieError as exc:
        raise click.ClickException(f"Nessie at {settings.nessie_url}: {exc}") from exc


def commit_hash(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An option callback: a commit hash is 8 to 64 hex digits (checked before Nessie is asked)."""
    if value is not None and not HASH.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not a commit hash (hex digits)")
    return value


@click.group()
def worlds() -> None:
    """Manage worlds: each world is a Nessie branch (prod is main, X is world-X)."""


@worlds.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def list_(settings: Settings, as_json: bool) -> None:
    """List worlds and their head commits.

    \b
    Example:
      causeway worlds list
    """
    found = _run(settings, lambda m: m.list())
    for w in found:
        if as_json:
            click.echo(orjson.dumps({"world": w.world_id, "branch": w.branch, "hash": w.hash}))
        else:
            click.echo(f"{w.world_id:24} {w.branch:30} {w.hash[:16]}")
    if not as_json:
        summary(
            f"worlds list ({now()})",
            [("worlds", f"{len(found)} world(s)"), ("nessie", mask_url(settings.nessie_url))],
        )


@worlds.command()
@click.argument("world_id")
@click.option("--from-world", default=None, help="Fork from this world's head (default: prod).")
@click.option("--from-tag", default=None, help="Fork from a tag (e.g. a release).")
@click.option("--from-commit", default=None, callback=commit_hash, help="Fork from a commit hash.")
@click.option("--dry-run", is_flag=True, help="Say what would be created, change nothing.")
@click.pass_obj
def create(
    settings: Settings,
    world_id: str,
    from_world: str | None,
    from_tag: str | None,
    from_commit: str | None,
    dry_run: bool,
) -> None:
    """Create WORLD_ID as a fork of prod, another world, a tag or a commit. Safe to run twice.

    \b
    Examples:
      causeway worlds create whatif-001
      causeway worlds create whatif-002 --from-world whatif-001
      causeway worlds create audit-q1 --from-tag release-2026-q1
    """
    if sum(x is not None for x in (from_world, from_tag, from_commit)) > 1:
        raise click.UsageError("give at most one of --from-world, --from-tag, --from-commit")
    source = ForkSource(world=from_world, tag=from_tag, commit=from_commit)
    naming = WorldNaming(settings.prod_world, settings.main_branch)
    try:
        branch = naming.branch(world_id)
    except InvalidWorldId as exc:
        raise click.ClickException(str(exc)) from exc
    if dry_run:
        existing, at = _run(settings, lambda m: m.plan_create(world_id, source))
        if existing is not None:
            click.echo(
                f"world {world_id} already exists on branch {existing.branch} at {existing.hash[:16]}: nothing to do"
            )
            outcome = "nothing to do (exists)"
        else:
            click.echo(f"would create world {world_id} (branch {branch}) from {source.describe()} at {at.hash[:16]}")
            outcome = "would create (dry run)"
        rows = [("branch", branch), ("from", source.describe()), ("outcome", outcome)]
        summary(f"worlds create {world_id} (dry run, {now()})", rows)
        return
    world, created = _run(settings, lambda m: m.create(world_id, source))
    verb = "created" if created else "already exists:"
    click.echo(f"{verb} world {world.world_id} on branch {world.branch} at {world.hash[:16]}")
    summary(
        f"worlds create {world_id} ({now()})",
        [
            ("branch", f"{world.branch} at {world.hash[:16]}"),
            ("from", source.describe()),
            ("outcome", "created" if created else "already existed: nothing changed"),
        ],
    )


@worlds.command()
@click.argument("world_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted, change nothing.")
@click.pass_obj
def delete(settings: Settings, world_id: str, yes: bool, dry_run: bool) -> None:
    """Delete WORLD_ID's branch (its commits stay reachable from tags and other branches).

    \b
    Example:
      causeway worlds delete whatif-001 --yes
    """
    world = _run(settings, lambda m: m.plan_delete(world_id))  # the real delete's checks, dry run or not
    title = f"worlds delete {world_id}{' (dry run)' if dry_run else ''} ({now()})"
    if world is None:
        click.echo(f"world {world_id} does not exist; nothing to do")
        summary(title, [("outcome", "nothing to do (no branch)")])
        return
    if dry_run:
        click.echo(f"would delete world {world_id} (branch {world.branch} at {world.hash[:16]})")
        summary(title, [("branch", f"{world.branch} at {world.hash[:16]}"), ("outcome", "would delete (dry run)")])
        return
    if not yes:
        click.confirm(f"Delete world {world_id} (branch {world.branch} at {world.hash[:16]})?", abort=True)
    deleted = _run(settings, lambda m: m.delete(world_id, world.hash))
    click.echo(f"deleted world {world_id}" if deleted else f"world {world_id} was already gone")
    summary(
        title,
        [
            ("branch", f"{world.branch} at {world.hash[:16]} (its commits stay reachable from tags and forks)"),
            ("outcome", "deleted" if deleted else "already gone"),
        ],
    )
