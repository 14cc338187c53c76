"""The worker's /health tells the truth: each dependency and loop, readiness apart from liveness.

The worker reaches Nessie through a proxy the test cuts and restores (the shared server keeps
running): while cut, /health and /health/ready answer 503 naming Nessie, /health/live stays 200
(a restart would not bring Nessie back); restored, it is ready again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from streams.settings import Settings
from tests.integration.pipeline import Pipeline
from tests.integration.proxy import CuttableProxy

pytestmark = pytest.mark.integration


async def _until(port: int, path: str, status: int, timeout: float = 60.0) -> dict:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    last: httpx.Response | None = None
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            last = await http.get(f"http://127.0.0.1:{port}{path}", timeout=5)
            if last.status_code == status:
                return last.json()
            await asyncio.sleep(0.5)
    raise AssertionError(f"{path} never answered {status}; last: {last and last.status_code} {last and last.text}")


async def test_health_reports_dependencies_and_loops_and_readiness_differs_from_liveness(
    unique: str, tmp_path: Path
) -> None:
    base = Settings.from_env()
    parsed = urlparse(base.nessie_url)
    proxy = CuttableProxy(parsed.hostname or "127.0.0.1", parsed.port or 0)
    proxied = base.nessie_url.replace(f":{parsed.port}", f":{proxy.start()}", 1)
    pipe = await Pipeline.create(unique, tmp_path, nessie_url=proxied, reconcile_interval_s=600.0)
    try:
        worker = pipe.start_worker()  # waits for /health 200: ready
        body = await _until(worker.port, "/health", 200)
        assert body["status"] == "ok" and body["ready"] and body["live"]
        assert {d: v["state"] for d, v in body["dependencies"].items()} == {
            "kafka": "up",
            "redis": "up",
            "nessie": "up",
        }
        assert {"intake", "schema-sync", "reconcile-timer"} <= set(body["loops"])
        assert body["loops"]["intake"]["state"] in ("idle", "ok")

        proxy.cut()
        down = await _until(worker.port, "/health", 503)
        assert down["status"] == "degraded" and not down["ready"] and down["live"]
        assert down["dependencies"]["nessie"]["state"] == "down"
        assert any(r.startswith("nessie down") for r in down["reasons"])
        assert (await _until(worker.port, "/health/ready", 503))["dependencies"]["nessie"]["state"] == "down"
        assert (await _until(worker.port, "/health/live", 200))["live"]

        proxy.restore()
        again = await _until(worker.port, "/health", 200)
        assert again["dependencies"]["nessie"]["state"] == "up" and again["ready"]
    finally:
        pipe.stop_all()
        proxy.close()
