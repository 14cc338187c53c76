"""Batches for the committer and the worlds tests: events, batches with offsets, fresh branches,
and reading back what a branch holds. Their fixtures (``client``,
``sink_settings``, ``world``) are in conftest.py."""

from __future__ import annotations

import uuid

from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.catalog import NessieCatalog
from sinks.committer import Batch, Source
from sinks.nessie import Reference, SyncNessieClient
from tests.factories import change_event, link_event


def empty_root(client: SyncNessieClient) -> Reference:
    """The repository's first (empty) commit: test branches start from it, whatever main holds."""
    return Reference("main", "BRANCH", client.config().no_ancestor_hash)


OBJ = "onto.changes.objects"
LNK = "onto.changes.links"


def obj(world: str, pk: str, change: str, version: int, typ: str = "person", **after: object) -> ChangeEvent:
    return change_event(
        f"{world}-{pk}-{change}-{version}-{uuid.uuid4().hex[:6]}",
        world=world,
        pk=pk,
        change=change,
        version=version,
        entity_type=typ,
        after=dict(after) if change not in ("DELETE", "TRUNCATE") else None,
        occurred_at_ms=1_700_000_000_000,
    )


def link(world: str, pk: str, version: int, frm: str, to: str) -> ChangeEvent:
    return link_event(
        f"{world}-{pk}-{version}-{uuid.uuid4().hex[:6]}",
        frm=frm,
        to=to,
        world=world,
        pk=pk,
        change=ChangeType.CREATE,
        version=version,
        after={"since": 2020},
        occurred_at_ms=1_700_000_000_000,
    )


def batch(world: str, batch_id: str, events: list[ChangeEvent], first_offset: int, partition: int = 0) -> Batch:
    items = [
        (e, Source(LNK if e.kind is EntityKind.LINK else OBJ, partition, first_offset + i))
        for i, e in enumerate(events)
    ]
    return Batch.from_sources(world, batch_id, items)


def objects(cat: NessieCatalog) -> dict[str, tuple[int, bool, str | None]]:
    t = cat.load_table("onto.entity_common").scan().to_arrow()
    out: dict[str, tuple[int, bool, str | None]] = {}
    for r in t.to_pylist():
        assert r["object_pk"] not in out, f"duplicate live row for {r['object_pk']}"
        out[r["object_pk"]] = (r["version"], r["deleted"], r["properties"])
    return out


def event_ids(cat: NessieCatalog) -> list[str]:
    return cat.load_table("onto.entity_events").scan().to_arrow().column("event_id").to_pylist()


def batch_commits(client: SyncNessieClient, branch: str, batch_id: str) -> list[str]:
    return [
        e.hash
        for page in client.history(branch, filter=f"commit.properties['causeway.batch_id'] == '{batch_id}'")
        for e in page
    ]
