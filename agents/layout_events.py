"""Partition evolution as a schema-sync control event: ``table.layout.evolve`` on the schema topic.

A control-plane service that moves a world's tables to a new layout publishes, on the same topic
as ``schema.updated`` (``Settings.schema_topic``)::

    {"event": "table.layout.evolve", "change_id": "c-42", "world_id": "whatif-001",
     "table": "entity_common", "spec": "identity(object_type_id), bucket(32, object_pk)",
     "sort": "default", "dry_run": false}

``table`` is a table name or ``all``; ``spec`` / ``sort`` use the text of ``causeway tables evolve``
(``default`` = the standard layout, at least one of them is given); ``world_id`` is a world or
``*`` (every world with a branch). Schema sync hands it to :func:`handle`, which carries it out
per world branch through :meth:`sinks.layout_run.TableLayouts.evolve_text`, the same code path as
the CLI (one Nessie commit per table, planned again on conflict, nothing to do when the table
already has the layout, so a redelivered event is harmless). Every table's outcome is answered on
``Settings.schema_answer_topic`` (``{"event": "table.layout.evolved", ...}`` with the old and new
spec and sort, ``status`` applied / unchanged / dry-run / refused); a refused event (bad text,
unknown table or world) is also dead-lettered with its reason. Transient failures (Nessie down,
retries exhausted) raise, and schema sync re-reads the record.

:func:`decode_layout_change` is pure.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from models.events import Invalid
from models.schema import ALL_WORLDS
from models.worlds import InvalidWorldId, validate_world_id
from sinks.layout import LayoutError, format_sort, format_spec
from sinks.layout_run import EvolveResult, TableLayoutError, TableLayouts, TableMissing
from sinks.tables import ALL_TABLES

log = logging.getLogger(__name__)

LAYOUT_EVENT = "table.layout.evolve"
LAYOUT_ANSWER = "table.layout.evolved"
_MARKER = LAYOUT_EVENT.encode()


@dataclass(frozen=True)
class LayoutChange:
    """A decoded ``table.layout.evolve`` control event."""

    change_id: str
    world_id: str  # a world id or ALL_WORLDS
    table: str  # a table name or "all"
    spec: str | None
    sort: str | None
    dry_run: bool = False

    def tables(self) -> list[str]:
        return [t.name for t in ALL_TABLES] if self.table == "all" else [self.table]


def is_layout_event(value: bytes | None) -> bool:
    """Whether a schema-topic record is a layout event (cheap byte check, then the field)."""
    if not value or _MARKER not in value:
        return False
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and doc.get("event") == LAYOUT_EVENT


def decode_layout_change(value: bytes | None) -> LayoutChange | Invalid:
    """Decode and check one layout event; never raises on bad input."""
    try:
        doc = orjson.loads(value or b"")
    except orjson.JSONDecodeError as exc:
        return Invalid("malformed-json", f"value is not valid UTF-8 JSON: {exc}")
    if not isinstance(doc, dict):
        return Invalid("not-an-object", "a layout event must be a JSON object")
    cid, world = doc.get("change_id"), doc.get("world_id")
    cid_ok = cid if isinstance(cid, str) else None
    world_ok = world if isinstance(world, str) else None

    def bad(reason: str, detail: str) -> Invalid:
        return Invalid(reason, detail, cid_ok, world_ok)

    if not cid_ok:
        return bad("missing-change-id", "'change_id' must be a non-empty string")
    if world != ALL_WORLDS:
        try:
            validate_world_id(world)
        except InvalidWorldId as exc:
            return bad("bad-world-id", str(exc))
    table = doc.get("table")
    names = [t.name for t in ALL_TABLES]
    if table != "all" and table not in names:
        return bad("unknown-table", f"'table' must be 'all' or one of {', '.join(names)}")
    spec, sort = doc.get("spec"), doc.get("sort")
    if spec is None and sort is None:
        return bad("no-layout", "give 'spec' and/or 'sort' ('default' for the standard layout)")
    if not all(v is None or isinstance(v, str) for v in (spec, sort)):
        return bad("bad-layout", "'spec' and 'sort' must be strings")
    dry_run = doc.get("dry_run", False)
    if not isinstance(dry_run, bool):
        return bad("bad-dry-run", "'dry_run' must be true or false")
    return LayoutChange(cid_ok, world, table, spec, sort, dry_run)  # type: ignore[arg-type]


def answer(change: LayoutChange, world: str, table: str, result: EvolveResult | None, error: str | None) -> dict:
    """The answer document of one table of one world (pure)."""
    doc: dict[str, Any] = {"event": LAYOUT_ANSWER, "change_id": change.change_id, "world_id": world, "table": table}
    if result is None:
        return {**doc, "status": "refused", "reason": error}
    evo = result.evolution
    status = "dry-run" if result.dry_run and result.changed else "applied" if result.commit else "unchanged"
    return {
        **doc,
        "status": status,
        "old": {"spec": format_spec(evo.old.spec), "sort": format_sort(evo.old.sort)},
        "new": {"spec": format_spec(evo.new.spec), "sort": format_sort(evo.new.sort)},
        "commit": result.commit,
    }


def apply(layouts: TableLayouts, change: LayoutChange, world: str) -> list[dict]:
    """Carry out ``change`` on one world (blocking); one answer per table. Raises on transient errors."""
    out = []
    for table in change.tables():
        try:
            result = layouts.evolve_text(world, table, change.spec, change.sort, dry_run=change.dry_run)
        except TableMissing as exc:
            if change.table == "all":  # created with the current layout by its first commit
                continue
            out.append(answer(change, world, table, None, f"table-missing: {exc}"))
            continue
        except LayoutError as exc:
            out.append(answer(change, world, table, None, f"bad-layout: {exc}"))
            continue
        except TableLayoutError as exc:
            if "has no branch" not in str(exc):
                raise  # retries exhausted: transient, the record is read again
            out.append(answer(change, world, table, None, f"unknown-world: {exc}"))
            continue
        out.append(answer(change, world, table, result, None))
    return out


async def handle(sync: Any, rec: Any) -> None:
    """Handle one layout event record for schema sync (``agents.schema_sync.SchemaSync``)."""
    change = decode_layout_change(rec.value)
    if isinstance(change, Invalid):
        log.warning("layout event %s@%d refused (%s): %s", rec.topic, rec.offset, change.reason, change.detail)
        await _send(sync, {"event": LAYOUT_ANSWER, "change_id": change.event_id, "world_id": change.world_id,
                           "status": "refused", "reason": f"{change.reason}: {change.detail}"}, rec.key)  # fmt: skip
        await sync._dead_letter(rec, change.reason, change.detail, change.event_id, change.world_id)
        return
    layouts = TableLayouts(sync.settings, sync.store.committer)
    worlds = await asyncio.to_thread(sync.store.worlds) if change.world_id == ALL_WORLDS else [change.world_id]
    for world in sorted(worlds):
        for doc in await asyncio.to_thread(apply, layouts, change, world):
            log.info("layout event %s on %s: %s", change.change_id, world, doc)
            await _send(sync, doc, rec.key)
            if doc["status"] == "refused":
                reason, _, detail = str(doc["reason"]).partition(": ")
                await sync._dead_letter(rec, reason, detail, change.change_id, world)


async def _send(sync: Any, doc: dict, key: bytes | None) -> None:
    producer = sync._producer
    if producer is not None:
        await producer.send_and_wait(sync.settings.schema_answer_topic, orjson.dumps(doc), key=key)
