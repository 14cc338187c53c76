"""A scratch world for the committer-alone measures: a branch from Nessie's empty root, a file warehouse of its own."""

from __future__ import annotations

import tempfile
import uuid

from sinks.committer import BatchCommitter
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings


def scratch_world(prefix: str, settings: Settings) -> tuple[Settings, SyncNessieClient, str, BatchCommitter]:
    """``settings`` on a temporary warehouse, a Nessie client, a new world ``<prefix><10 hex>`` whose
    branch starts empty, and a committer for it; :func:`drop_world` deletes the branch."""
    settings = settings.replace(warehouse=f"file://{tempfile.mkdtemp(prefix=f'{prefix}-')}/warehouse")
    client = SyncNessieClient(settings.nessie_url)
    world = f"{prefix}{uuid.uuid4().hex[:10]}"
    client.create_branch(f"world-{world}", Reference("main", "BRANCH", client.config().no_ancestor_hash))
    return settings, client, world, BatchCommitter(settings, client)


def drop_world(client: SyncNessieClient, world: str) -> None:
    client.delete_reference(f"world-{world}", client.get_reference(f"world-{world}").hash, "BRANCH")
