"""Fixtures for the world read/rewind tests: a world written by the real committer, and the API on it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from models.events import ChangeEvent
from sinks.committer import BatchCommitter
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings
from tests.integration.commits import batch, empty_root
from worlds.api import Worlds


@dataclass
class WrittenWorld:
    """A world on the real Nessie, written batch by batch; ``heads`` holds the hash after each batch."""

    world: str
    branch: str
    committer: BatchCommitter
    client: SyncNessieClient
    heads: list[str] = field(default_factory=list)
    next_offset: int = 0

    def commit(self, batch_id: str, events: list[ChangeEvent]) -> str:
        out = self.committer.commit_batch(batch(self.world, batch_id, events, self.next_offset))
        self.next_offset += len(events)
        self.heads.append(out.hash)
        return out.hash


@pytest.fixture
def world_settings(settings: Settings, warehouse: str) -> Settings:
    return settings.replace(warehouse=warehouse, commit_backoff_s=0.02)


@pytest.fixture
def wclient(nessie_url: str) -> Iterator[SyncNessieClient]:
    with SyncNessieClient(nessie_url) as c:
        yield c


def cleanup_refs(client: SyncNessieClient, suffix: str) -> None:
    """Delete every branch and tag whose name contains ``suffix`` (the test's unique id)."""
    for ref in client.list_references():
        if suffix in ref.name:
            try:
                client.delete_reference(ref.name, ref.hash, ref.type)
            except Exception:  # noqa: BLE001 - cleanup only
                pass


@pytest.fixture
def written(world_settings: Settings, wclient: SyncNessieClient, unique: str) -> Iterator[WrittenWorld]:
    world = f"t{unique}"
    branch = f"world-{world}"
    wclient.create_branch(branch, empty_root(wclient))
    yield WrittenWorld(world, branch, BatchCommitter(world_settings, wclient), wclient)
    cleanup_refs(wclient, unique)


@pytest.fixture
def api(world_settings: Settings, wclient: SyncNessieClient) -> Iterator[Worlds]:
    with Worlds(world_settings, wclient) as a:
        yield a


def fork(written: WrittenWorld, api: Worlds, name: str) -> WrittenWorld:
    head = api.head(written.world)
    api.client.create_branch(f"world-{name}", Reference(head.name, "BRANCH", head.hash))
    return WrittenWorld(name, f"world-{name}", written.committer, written.client, next_offset=100_000)
