"""A scratch world for the committer-alone measures: a branch from Nessie's empty root, a file warehouse of its own."""

from __future__ import annotations

import tempfile
import uuid

from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.committer import BatchCommitter
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings


def scratch_world(prefix: str, settings: Settings) -> tuple[Settings, SyncNessieClient, str, BatchCommitter]:
    """``settings`` on a temporary warehouse, a Nessie client, a new world ``<prefix><10 hex>`` whose
    branch starts empty, and a committer for it; :func:`drop_world` deletes the branch."""
    settings = settings.replace(warehouse=f"file://{tempfile.mkdtemp(prefix=f'{prefix}-')}/warehouse")
    client = SyncNessieClient(settings.nessie_url)
    return settings, client, add_world(client, prefix), BatchCommitter(settings, client)


def add_world(client: SyncNessieClient, prefix: str) -> str:
    """One more scratch world on ``client``'s Nessie (an empty branch), for a committer made by
    :func:`scratch_world`: its warehouse holds every world's files, as a worker's does."""
    world = f"{prefix}{uuid.uuid4().hex[:10]}"
    client.create_branch(f"world-{world}", Reference("main", "BRANCH", client.config().no_ancestor_hash))
    return world


def drop_world(client: SyncNessieClient, world: str) -> None:
    client.delete_reference(f"world-{world}", client.get_reference(f"world-{world}").hash, "BRANCH")


def scratch_event(world: str, kind: EntityKind, pk: str, version: int, n: int) -> ChangeEvent:
    """A snapshot event of a scratch world (objects ``person``, links ``knows``), unique by its id."""
    return ChangeEvent(
        event_id=f"{world}-{pk}-{version}-{uuid.uuid4().hex[:8]}",
        world_id=world,
        kind=kind,
        entity_type="person" if kind is EntityKind.OBJECT else "knows",
        entity_pk=pk,
        change_type=ChangeType.SNAPSHOT,
        version=version,
        before=None,
        after={"n": n, "name": f"p{n}"},
        caused_by=None,
        causal_order=None,
        occurred_at_ms=1_700_000_000_000 + n,
        schema_version=0,
        source="bench",
        **({"from_pk": "a", "to_pk": "b"} if kind is EntityKind.LINK else {}),  # type: ignore[arg-type]
    )
