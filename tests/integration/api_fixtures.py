"""Fixtures for the API tests: ``causeway serve`` as a real process on a unique prod branch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.api_load import ApiProcess, start_api
from sinks.nessie import SyncNessieClient
from streams.settings import Settings
from tests.integration.commits import empty_root
from tests.integration.worlds_fixtures import cleanup_refs


@pytest.fixture
def api_settings(
    world_settings: Settings, wclient: SyncNessieClient, redis_url: str, unique: str
) -> Iterator[Settings]:
    """Settings whose prod world is a fresh branch ``main-<unique>`` (never Nessie's real main)."""
    main = f"main-{unique}"
    wclient.create_branch(main, empty_root(wclient))
    yield world_settings.replace(
        main_branch=main,
        api_redis_prefix=f"causeway:api-test-{unique}",
        api_lock_lease_s=2.0,
        api_inflight_wait_s=30.0,
        api_idempotency_ttl_s=900,  # the shared Redis forgets the test's outcomes soon
    )
    cleanup_refs(wclient, unique)


@pytest.fixture
def server(api_settings: Settings, tmp_path: Path) -> Iterator[ApiProcess]:
    proc = start_api(api_settings, tmp_path)
    yield proc
    proc.stop()
