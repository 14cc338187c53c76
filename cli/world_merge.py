"""`causeway worlds merge` and `causeway worlds conflicts list|show|resolve`: three-way world merges.

Thin shells over ``worlds.api.Worlds.merge_worlds`` and the pending-merge calls of
``worlds.merge_run.MergeOps`` (or their twins over the API, ``api.remote_worlds``, when
``CAUSEWAY_API_URL`` is set); the rules are in ``worlds.merge`` and docs/worlds.md. Both print from
the outcome's JSON document, so the output is the same whichever path answered.
"""

from __future__ import annotations

from typing import Any

import click
import orjson

from cli.world_history import _api, _json, _summary
from cli.worlds import worlds
from streams.settings import Settings
from worlds.merge import Strategies


def _print(out: dict[str, Any], as_json: bool) -> None:
    """The outcome document (``MergeOutcome.to_json``, local or sent by the API) as text or JSON."""
    if as_json:
        _json(out)
        return
    for c in out["conflict_list"]:
        fields = f" fields={','.join(f.removeprefix('p:') for f in c['fields'])}" if c.get("fields") else ""
        ends = f" endpoints={','.join(c['endpoints'])} link-side={c.get('link_side')}" if c.get("endpoints") else ""
        click.echo(f"! {c['conflict']:<14} {c['kind']} {c['type']}/{c['pk']}{fields}{ends}")
    for sc in out["schema_conflicts"]:
        click.echo(f"! SCHEMA         {sc['table']}.{sc['column']}: {sc['detail']}")
    source, target = out["source"], out["target"]
    verb = {
        "merged": f"merged {source} into {target} in commit {out['commit']}",
        "planned": f"dry run: would merge {source} into {target} (nothing written)",
        "nothing-to-merge": f"nothing to merge from {source} into {target}",
        "conflicts": f"not merged: conflicts between {source} and {target} (nothing written)",
        "pending": f"MANUAL merge pending: `causeway worlds conflicts resolve {target} ID --take ...`, "
        f"then `causeway worlds merge --continue --into {target}`",
    }[out["status"]]
    if out["dry_run"] and out["status"] == "conflicts":
        verb = "dry run: the merge would stop on conflicts (nothing written)"
    click.echo(verb)
    taken, strategy = out["taken"], out["strategy"]
    _summary(
        "merge",
        [
            ("source", f"{source}@{out['source_hash'][:16]}"),
            ("target", f"{target}@{out['target_head'][:16]}"),
            ("base", out["base"][:16]),
            ("strategy", str(strategy["default"]) + "".join(f" {k}={v}" for k, v in strategy["per_type"].items())),
            ("from source", taken.get("source", 0)),
            ("from target", taken.get("target", 0) + taken.get("same", 0)),
            ("field-wise", taken.get("merged", 0)),
            ("writes", out["writes"]),
            ("conflicts", _counts(out["conflicts"], len(out["schema_conflicts"]))),
            ("resolved", _counts(out["resolved"], 0)),
            ("commit", out["commit"] or "-"),
            *((f"read {side}", _read(out["read"].get(side, {}))) for side in ("source", "target")),
            ("attempts", out["attempts"]),
        ],
    )


def _read(stats: dict[str, dict[str, int]]) -> str:
    files = sum(s["data_files_read"] for s in stats.values())
    skipped = sum(s["data_files_skipped"] for s in stats.values())
    deletes = sum(s["delete_files_read"] for s in stats.values())
    size = sum(s["bytes_read"] for s in stats.values())
    return f"{files} data files ({skipped} shared, skipped), {deletes} delete files, {size:,} bytes"


def _counts(counts: dict[str, int], schema: int) -> str:
    items = dict(counts)
    if schema:
        items["SCHEMA"] = schema
    return ", ".join(f"{k}={v}" for k, v in items.items()) or "0"


@worlds.command("merge")
@click.argument("source", required=False)
@click.option("--into", "target", required=True, help="The target world (prod for main).")
@click.option(
    "--strategy",
    default="NORMAL",
    show_default=True,
    help="NORMAL, OURS|TARGET_WINS, THEIRS|SOURCE_WINS, FIELD_LEVEL[+S], TIMESTAMP_WINS or MANUAL.",
)
@click.option("--strategy-for", multiple=True, metavar="TYPE=S", help="Per-type strategy (repeatable).")
@click.option("--dry-run", is_flag=True, help="Report the conflicts and counts the merge would have; write nothing.")
@click.option("--message", "-m", default=None, help="Commit message.")
@click.option("--continue", "cont", is_flag=True, help="Commit the pending MANUAL merge into --into.")
@click.option("--abort", is_flag=True, help="Drop the pending MANUAL merge into --into.")
@click.option("--json", "as_json", is_flag=True, help="The result as one JSON object.")
@click.pass_obj
def merge_cmd(
    settings: Settings,
    source: str | None,
    target: str,
    strategy: str,
    strategy_for: tuple[str, ...],
    dry_run: bool,
    message: str | None,
    cont: bool,
    abort: bool,
    as_json: bool,
) -> None:
    """Three-way merge of world SOURCE into --into, entity by entity and property by property.

    \b
    Examples:
      causeway worlds merge whatif-001 --into prod --dry-run
      causeway worlds merge whatif-001 --into prod --strategy FIELD_LEVEL+THEIRS --strategy-for team=OURS
      causeway worlds merge whatif-001 --into prod --strategy MANUAL
      causeway worlds merge --continue --into prod
    """
    with _api(settings) as api:
        if abort:
            api.abort_merge(target)
            click.echo(f"dropped the pending merge into {target}")
            return
        if cont:
            out = api.continue_merge(target, message=message)
        else:
            if source is None:
                raise click.UsageError("SOURCE is required (or --continue / --abort)")
            strategies = Strategies.parse(strategy, strategy_for)
            out = api.merge_worlds(source, target, strategies, dry_run=dry_run, message=message)
        _print(out.to_json(), as_json)
        if out.status in ("conflicts", "pending") and not dry_run:
            raise SystemExit(1)


@worlds.group("conflicts")
def conflicts() -> None:
    """The conflicts of a pending MANUAL merge: list, show, resolve (then `worlds merge --continue`)."""


def _conflict_line(c: dict[str, Any], choice: str | None) -> str:
    return f"{c['id']:>4}  {c['conflict']:<14} {c['kind']} {c['type']}/{c['pk']}  " + (
        f"-> {choice}" if choice else "(open)"
    )


def _choices(doc: dict[str, Any]) -> dict[int, str]:
    res = doc.get("resolutions", {})
    return {
        c["id"]: res[k] for c in doc["conflicts"] if (k := f"{c['kind']}/{c['type']}/{c['pk']}/{c['conflict']}") in res
    }


@conflicts.command("list")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def conflicts_list(settings: Settings, target: str, as_json: bool) -> None:
    """List the conflicts of the pending merge into TARGET.

    \b
    Example:
      causeway worlds conflicts list prod
    """
    with _api(settings) as api:
        doc = api.pending_merge(target)
        if as_json:
            _json(doc)
            return
        chosen = _choices(doc)
        for c in doc["conflicts"]:
            click.echo(_conflict_line(c, chosen.get(c["id"])))
        _summary(
            f"pending merge {doc['source']} -> {target}",
            [("conflicts", len(doc["conflicts"])), ("resolved", len(chosen)), ("planned at", doc["created"])],
        )


@conflicts.command("show")
@click.argument("target")
@click.argument("conflict_id", type=int)
@click.pass_obj
def conflicts_show(settings: Settings, target: str, conflict_id: int) -> None:
    """Base, source and target state of one conflict.

    \b
    Example:
      causeway worlds conflicts show prod 3
    """
    with _api(settings) as api:
        doc = api.pending_merge(target)
        found = [c for c in doc["conflicts"] if c["id"] == conflict_id]
        if not found:
            raise click.ClickException(f"no conflict {conflict_id} in the pending merge into {target}")
        click.echo(orjson.dumps(found[0], option=orjson.OPT_INDENT_2).decode())


@conflicts.command("resolve")
@click.argument("target")
@click.argument("conflict_id", type=int)
@click.option("--take", required=True, help="source, target, or value=JSON (the properties to keep; null deletes).")
@click.pass_obj
def conflicts_resolve(settings: Settings, target: str, conflict_id: int, take: str) -> None:
    """Choose the outcome of one conflict of the pending merge into TARGET.

    \b
    Example:
      causeway worlds conflicts resolve prod 3 --take 'value={"team": "ops"}'
    """
    with _api(settings) as api:
        c = api.resolve_conflict(target, conflict_id, take)
        click.echo(_conflict_line(c, take))
