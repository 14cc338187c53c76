"""Rebuild a world's projections on a new branch, diff them, and swap the world onto it.

1. Pin the world's head ``H``; read ``entity_events`` and both projections at ``H``.
2. Fold the log (:mod:`ops.rebuild.plan`) and diff against the live projections.
3. Unless identical (or a dry run): create branch ``rebuild-<world>-<H[:12]>`` at ``H`` and
   overwrite ``entity_common`` and ``entity_edge`` there in **one** Nessie commit (the event log
   and its committed-offset summary are untouched). A second run finds that branch and reuses it.
4. ``swap``: assign the world's branch to the rebuilt head *expecting* ``H``. Nessie refuses if the
   world moved meanwhile (a worker committed): nothing changes, and the operator runs it again.
   The rebuilt head is a child of ``H``, so the swap loses no commit. The rebuild branch is then
   deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.errors import WorldsError
from models.worlds import WorldNaming
from ops.rebuild.plan import LOG_COLUMNS, Key, Rebuilt, Row, TableDiff, diff, fold
from sinks.catalog import NessieCatalog
from sinks.errors import NessieConflict, NessieNotFound
from sinks.nessie import Reference, SyncNessieClient
from sinks.overwrite import overwrite_tables
from sinks.readback import RowProgress, open_table, scan_rows
from sinks.tables import COMMON, EDGE, ENTITY_EVENTS, TableDef
from streams.settings import Settings

PROP_REBUILD_OF = "causeway.rebuild_of"


class RebuildError(WorldsError):
    """The rebuild or swap cannot proceed; the message says why and what to do."""


@dataclass
class RebuildResult:
    world: str
    branch: str
    head: str
    rebuilt: Rebuilt
    diffs: list[TableDiff] = field(default_factory=list)
    rebuild_branch: str | None = None
    rebuild_head: str | None = None
    reused: bool = False
    swapped: bool = False
    removed: list[str] = field(default_factory=list)  # stale rebuild branches of older heads, deleted

    @property
    def identical(self) -> bool:
        return all(d.identical for d in self.diffs)


def _read(
    cat: NessieCatalog,
    ns: str,
    table: str,
    columns: tuple[str, ...] | None = None,
    progress: RowProgress | None = None,
    where: str | None = None,
) -> list[Row]:
    """Rows of a table at the catalog's reference, read batch by batch (reported to ``progress``)."""
    return scan_rows(open_table(cat, ns, table), columns, where=where, progress=progress)


def _live(rows: list[Row], tdef: TableDef) -> dict[Key, Row]:
    type_col, pk_col = tdef.key
    return {(r[type_col], r[pk_col]): r for r in rows}


def rebuild_name(world: str, head: str) -> str:
    return f"rebuild-{world}-{head[:12]}"


def stale_rebuilds(world: str, head: str, names: list[str]) -> list[str]:
    """Rebuild branches of ``world`` made from another head than ``head`` (pure).

    They can never be swapped in (a swap expects the head the rebuild read), so a rebuild deletes them.
    """
    prefix = f"rebuild-{world}-"
    return sorted(
        n
        for n in names
        if n.startswith(prefix)
        and len(n) == len(prefix) + 12
        and all(c in "0123456789abcdef" for c in n[len(prefix) :])
        and n != rebuild_name(world, head)
    )


def rebuild(
    settings: Settings, world: str, *, write: bool = True, swap: bool = False, progress: RowProgress | None = None
) -> RebuildResult:
    """Rebuild ``world`` (see the module docstring); ``write=False`` is the dry run."""
    naming = WorldNaming(settings.prod_world, settings.main_branch)
    branch = naming.branch(world)
    client = SyncNessieClient.from_settings(settings)
    try:
        head = client.get_reference(branch).hash
    except NessieNotFound as exc:
        raise RebuildError(f"world {world} has no branch {branch}") from exc
    ns = settings.namespace
    cat = NessieCatalog.from_settings(settings, f"{branch}@{head}", client=client)
    log_rows = _read(cat, ns, ENTITY_EVENTS, LOG_COLUMNS, progress, where="applied == true")
    rebuilt = fold(log_rows)
    live_objects = _live(_read(cat, ns, COMMON.name, progress=progress), COMMON)
    live_links = _live(_read(cat, ns, EDGE.name, progress=progress), EDGE)
    result = RebuildResult(world, branch, head, rebuilt)
    result.diffs = [diff(COMMON.name, live_objects, rebuilt.objects), diff(EDGE.name, live_links, rebuilt.links)]
    if not write or result.identical:
        return result

    rb = rebuild_name(world, head)
    result.rebuild_branch = rb
    for ref in client.list_references():
        if ref.type == "BRANCH" and ref.name in stale_rebuilds(world, head, [ref.name]):
            try:
                client.delete_reference(ref.name, ref.hash, "BRANCH")
                result.removed.append(ref.name)
            except (NessieConflict, NessieNotFound):
                pass  # moved or removed meanwhile: left alone
    try:
        existing = client.get_reference(rb)
    except NessieNotFound:
        existing = None
    if existing is not None:
        last = next(iter(next(iter(client.history(rb, max_records=1)))), None)
        if last is None or last.properties.get(PROP_REBUILD_OF) != head:
            raise RebuildError(f"branch {rb} exists but is not a rebuild of {head[:12]}; delete it and retry")
        result.rebuild_head, result.reused = existing.hash, True
    else:
        client.create_branch(rb, Reference(branch, "BRANCH", head))
        result.rebuild_head = _write(settings, client, rb, world, head, rebuilt)
    if swap:
        _swap(client, result)
    return result


def _write(settings: Settings, client: SyncNessieClient, rb: str, world: str, head: str, rebuilt: Rebuilt) -> str:
    """Overwrite both projections on ``rb`` in one commit, through the write path's commit loop.

    "Did it land?": the rebuild commit is the one on ``rb`` that names the head it rebuilt.
    """
    return overwrite_tables(
        settings,
        client,
        rb,
        [(COMMON, list(rebuilt.objects.values())), (EDGE, list(rebuilt.links.values()))],
        message=f"causeway: rebuild projections of world {world} from its event log at {head[:12]}",
        properties={PROP_REBUILD_OF: head, "causeway.world": world},
        id_property=PROP_REBUILD_OF,
    )


def _swap(client: SyncNessieClient, result: RebuildResult) -> None:
    assert result.rebuild_branch is not None and result.rebuild_head is not None
    try:
        client.assign_reference(
            result.branch, result.head, Reference(result.rebuild_branch, "BRANCH", result.rebuild_head)
        )
    except NessieNotFound as exc:
        raise RebuildError(
            f"rebuild branch {result.rebuild_branch} is gone (a later rebuild removed it: world {result.world} "
            f"moved since {result.head[:12]}); nothing was swapped. Run the rebuild again"
        ) from exc
    except NessieConflict as exc:
        # This rebuild branch can never be swapped in now: remove it rather than leave it behind.
        try:
            client.delete_reference(result.rebuild_branch, result.rebuild_head, "BRANCH")
            gone = f"; {result.rebuild_branch} was deleted"
        except (NessieConflict, NessieNotFound):
            gone = f"; delete {result.rebuild_branch} by hand if it is still there"
        raise RebuildError(
            f"world {result.world} moved since {result.head[:12]} (a worker committed); nothing was swapped{gone}. "
            f"Run the rebuild again (it starts from the new head), or stop the workers first"
        ) from exc
    result.swapped = True
    try:
        client.delete_reference(result.rebuild_branch, result.rebuild_head, "BRANCH")
    except (NessieConflict, NessieNotFound):
        pass  # someone moved or removed it; the swap stands
