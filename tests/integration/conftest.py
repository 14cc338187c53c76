"""Fixtures shared by integration tests: a Nessie client, sink settings on a fresh warehouse, a
fresh world whose branch starts from the repository's empty root, and settings for an applier on a
fresh warehouse (``eo_settings``). A module that defines a fixture of the same name uses its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sinks.nessie import SyncNessieClient
from streams.settings import Settings
from tests.integration.commits import empty_root


@pytest.fixture
def client(nessie_url: str) -> Iterator[SyncNessieClient]:
    with SyncNessieClient(nessie_url) as c:
        yield c


@pytest.fixture
def sink_settings(settings: Settings, warehouse: str) -> Settings:
    return settings.replace(warehouse=warehouse, commit_backoff_s=0.02)


@pytest.fixture
def world(client: SyncNessieClient, unique: str) -> str:
    """A fresh world with its branch forked from main."""
    world_id = f"t{unique}"
    client.create_branch(f"world-{world_id}", empty_root(client))
    return world_id


@pytest.fixture
def eo_settings(settings: Settings, tmp_path: Path) -> Settings:
    return settings.replace(
        warehouse=f"file://{tmp_path}/warehouse",
        batch_max_events=100,
        batch_max_seconds=0.0,
        causal_timeout_s=5.0,
        commit_backoff_s=0.02,
    )
