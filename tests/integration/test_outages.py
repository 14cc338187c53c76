"""A Redis or Nessie outage pauses the worker (log line + metric) and loses nothing.

The worker reaches the real service through a proxy the test cuts and restores, so the outage is
real for that worker (connections refused and dropped) while the shared server keeps running.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from cli.workload import generate
from tests.integration.pipeline import Pipeline, assert_matches_model
from tests.integration.proxy import CuttableProxy

pytestmark = pytest.mark.integration


def _dependency_up(port: int, dependency: str) -> float | None:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    m = re.search(rf'^causeway_dependency_up\{{dependency="{dependency}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def _causally_closed_split(records: list, near: int) -> int:
    """A split index at or after ``near`` such that no cause of the first part is in the second
    (otherwise draining the first part would wait for the causal timeout)."""
    for split in range(near, len(records)):
        first = {r.event.event_id for r in records[:split] if r.event}
        if all(r.event.caused_by in first for r in records[:split] if r.event and r.event.caused_by):
            return split
    return len(records)


@pytest.mark.parametrize("service", ["redis", "nessie"])
async def test_outage_pauses_then_resumes_without_loss(service: str, unique: str, tmp_path: Path) -> None:
    from streams.settings import Settings

    base = Settings.from_env()
    url = base.redis_url if service == "redis" else base.nessie_url
    parsed = urlparse(url)
    proxy = CuttableProxy(parsed.hostname or "127.0.0.1", parsed.port or 0)
    port = proxy.start()
    proxied = url.replace(f":{parsed.port}", f":{port}", 1)
    override = {"redis_url": proxied} if service == "redis" else {"nessie_url": proxied}
    pipe = await Pipeline.create(unique, tmp_path, **override)
    try:
        wl = generate(pipe.params(events=1200, worlds=2, keys=50, seed=51))
        half = _causally_closed_split(wl.records, len(wl.records) // 2)
        worker = pipe.start_worker()
        await pipe.publish(wl.records[:half])
        await pipe.wait_drained()

        proxy.cut()
        await pipe.publish(wl.records[half:])
        await asyncio.sleep(6)
        assert worker.alive(), "an outage must pause the worker, not kill it"
        assert await pipe.lag() > 0, "nothing may be acked while the dependency is down"
        assert _dependency_up(worker.port, service) == 0.0
        log = worker.log.read_text()
        assert "retrying in" in log, "the pause must be visible in the log"
        # Backoff, not a spin: a handful of attempts in 6 s, not thousands.
        attempts = log.count("retrying in")
        assert attempts < 30, f"{attempts} retries in 6 s looks like spinning"

        proxy.restore()
        await pipe.wait_drained(timeout=120)
        assert _dependency_up(worker.port, service) == 1.0
        letters = await pipe.dead_letters()
        assert len(letters) == wl.bad_count, [(dl.reason, dl.event_id, dl.detail) for dl in letters if dl.event_id]
        assert_matches_model(pipe, wl.valid_events)
    finally:
        pipe.stop_all()
        proxy.close()
