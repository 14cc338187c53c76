"""Fixtures for the merge and publish API tests: a server with its own merge and publish state, two worlds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.api_load import ApiProcess, start_api
from streams.settings import Settings
from tests.integration.commits import obj
from tests.integration.worlds_fixtures import WrittenWorld, fork
from worlds.api import Worlds


@pytest.fixture
def server(api_settings: Settings, tmp_path: Path, unique: str) -> Iterator[ApiProcess]:
    """The server with its own pending-merge directory and publish log branch."""
    settings = api_settings.replace(
        data_dir=str(tmp_path / "data"),
        publish_log_branch=f"publish-log-{unique}",
        # the default lease: merges are slow on a loaded box, and a holder slower than its lease loses
        # the key to a concurrent caller (one effect still, but two answers); the kill tests keep 2 s
        api_lock_lease_s=30.0,
    )
    proc = start_api(settings, tmp_path)
    yield proc
    proc.stop()


@pytest.fixture
def pair(written: WrittenWorld, api: Worlds) -> tuple[WrittenWorld, WrittenWorld]:
    """(target, source): the target holds p1..p4; the source is forked from it."""
    w = written.world
    written.commit("base", [obj(w, f"p{i}", "CREATE", 1, name=f"n{i}") for i in range(1, 5)])
    return written, fork(written, api, f"{w}-src")
