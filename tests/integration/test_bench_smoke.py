"""The benchmark harness runs end to end on a tiny profile and reports every figure for every contender.

No timing thresholds: targets belong in docs/benchmarks.md, not in tests.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from bench.__main__ import main
from bench.cleanup import keys_made_by, made_by
from bench.profiles import CONTENDERS
from sinks.nessie import SyncNessieClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIGURES = (
    "events_preloaded",
    "events_settled",
    "capped",
    "startup_s",
    "preload_s",
    "events_per_s",
    "latency_s",
    "latency_censored",
    "nessie_commits",
    "commit_s",
    "peak_rss_mb",
    "cpu_s_per_1k_events",
    "services_cpu_s_per_1k_events",
    "bytes_ingested",
    "data_bytes_written",
    "write_amplification",
    "rewrite_amplification",
    "metadata_bytes_written",
    "metadata_bytes_per_1k_events",
    "current_metadata_json_bytes",
)


@pytest.mark.timeout(240)
def test_tiny_run_reports_every_figure(
    tmp_path: Path, kafka_bootstrap: str, redis_url: str, nessie_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--profile", "tiny", "--out", str(tmp_path)]) == 0
    [result] = tmp_path.glob("*.json")
    doc = json.loads(result.read_text())
    assert set(doc["contenders"]) == set(CONTENDERS)
    for name, fig in doc["contenders"].items():
        missing = [k for k in FIGURES if fig.get(k) is None]
        assert not missing, f"{name} lacks {missing}"
        assert fig["events_preloaded"] == doc["run"]["workload"]["records"]
        assert fig["events_per_s"] > 0, name
        assert fig["nessie_commits"] > 0, name
        assert fig["data_bytes_written"] > 0, name
        assert {"p50", "p95", "p99"} <= set(fig["latency_s"]), name
        assert {"mean", "p50", "p99"} <= set(fig["commit_s"]), name
        # one latency phase per offered rate (tiny: 200/s, then 400/s), each with its quantiles
        assert [ph["offered_rate"] for ph in fig["latency_phases"]] == [200, 400], name
        assert all({"p50", "p99"} <= set(ph["latency_s"]) for ph in fig["latency_phases"]), name
    for name in ("causeway", "ceiling"):
        assert not doc["contenders"][name]["capped"], f"{name} must drain the tiny preload"
    assert set(doc["ratios"]) == {"causeway/ceiling", "causeway/naive"}
    for key in ("machine", "versions", "profile", "workload"):
        assert doc["run"][key], key
    [table] = tmp_path.glob("*.md")
    assert "| events/s" in table.read_text() and "at further rates" in table.read_text()
    out = capsys.readouterr().out
    assert "causeway/ceiling" in out
    # What the run made is gone once it ended (runs used to leave it all: 3,930 branches, 2,222
    # topics and 22 GB of warehouses had piled up on one machine); its logs stay.
    unique, work = doc["run"]["id"], Path(doc["run"]["work_dir"])
    with SyncNessieClient(nessie_url) as client:
        assert made_by([r.name for r in client.list_references()], unique) == []
    assert made_by(asyncio.run(_topics(kafka_bootstrap)), unique) == []
    assert not list(work.glob("*/warehouse")) and list(work.glob("*.log"))
    # Its Redis keys too (dead-letter decisions of its topics, its worlds' marks, the ceiling's):
    # a day of runs had left 904k keys, 1.2 GB. Failed before: the run's keys stayed.
    assert keys_made_by(asyncio.run(_redis_keys(redis_url, unique)), unique) == []
    assert "'redis_keys': 0" not in out and "'redis_keys': " in out


async def _topics(bootstrap: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return list(await admin.list_topics())
    finally:
        await admin.close()


async def _redis_keys(url: str, unique: str) -> list[str]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        return [k.decode() async for k in client.scan_iter(match=f"*{unique}*", count=10_000)]
    finally:
        await client.aclose()
