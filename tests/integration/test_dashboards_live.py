"""Every dashboard query against the real Prometheus, scraping a real /metrics endpoint.

For now the endpoint is causeway's metrics registry served from this test on 127.0.0.1:6070 (found
through the discovery folder, like a worker), fed by a thread that plays a healthy worker under
steady load: events consumed, deduplicated and committed, dependencies probed, one reconciliation
run, and the lag exporter's offsets and lag (served from the same endpoint).
No faults (dead letters, retries, merges). Every query must parse; every query
not documented as "empty at rest" must return data. The real worker under load is in
test_metrics_live.py; this simulation stays because it also sets what that worker does not export
yet (a schema version vector, a reconciliation run), so those panels are seen returning data too.
"""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

from monitoring import discovery, promql_check
from monitoring.lag_exporter import LagMetrics
from monitoring.metrics import Metrics, serve
from streams.lag import PartitionOffsets
from streams.settings import Settings

pytestmark = pytest.mark.integration

SCRAPE_PORT = 6070
SCRAPE_TIMEOUT_S = 30.0
DATA_TIMEOUT_S = 60.0


class SteadyLoad(threading.Thread):
    """Feeds ``metrics`` as a healthy worker would, until stopped."""

    def __init__(self, metrics: Metrics, lag: LagMetrics, world: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.m, self.lag, self.world, self.topic = metrics, lag, world, topic
        self.stopped = threading.Event()
        self.end = {0: 0, 1: 0}
        self.committed_offset = {0: 0, 1: 0}

    def run(self) -> None:
        m, world = self.m, self.world
        for dep in ("redis", "nessie", "kafka"):
            m.dependency(dep, True)
        m.dead_letter_series([self.topic])  # as a worker does at start-up
        m.schema_versions(world, {"control": 4, "data": 4, "intelligence": 3})
        m.reconciled(world, "ok", duration_s=0.8, drift={"person": 0, "org": 0})
        m.last_commit_seen(world, time.time() - 5)
        rng = random.Random(7)
        while not self.stopped.wait(0.2):
            now = time.time()
            n = rng.randint(50, 150)
            for p in (0, 1):
                self.end[p] += n // 2
            m.consumed(self.topic, n)
            m.idempotency(world, lookups=n, duplicates=rng.choice((0, 0, 0, 1)))
            m.event_outcome(world, "applied", n)
            m.set_parked(world, 0)
            m.inflight(world, rng.randint(1, n), now - rng.uniform(0.05, 0.5))
            m.committed(
                world,
                duration_s=rng.uniform(0.02, 0.2),
                rows=n,
                nbytes=n * 350,
                occurred_at=[now - rng.uniform(0.1, 1.5) for _ in range(n)],
                at=now,
            )
            rows = []
            for p in (0, 1):
                self.committed_offset[p] = self.end[p] - rng.randint(0, 40)
                rows.append(PartitionOffsets(self.topic, p, self.end[p], 0, self.committed_offset[p], now - 1.0))
            self.lag.record(f"group-{self.topic}", rows, now)  # what the lag exporter exports


class _LagSeries:
    """The lag exporter's series served from the same endpoint (its dependency gauge is the worker's)."""

    def __init__(self, lag: LagMetrics) -> None:
        self.lag = lag

    def collect(self):  # noqa: ANN201 - prometheus_client collector protocol
        return [f for f in self.lag.registry.collect() if f.name != "causeway_dependency_up"]


@pytest.fixture
def metrics_endpoint():
    m = Metrics()
    m.lag = LagMetrics()  # type: ignore[attr-defined]
    m.registry.register(_LagSeries(m.lag))  # type: ignore[attr-defined]
    try:
        server = serve(m, SCRAPE_PORT, "127.0.0.1")
    except OSError as exc:
        pytest.fail(f"cannot serve metrics on 127.0.0.1:{SCRAPE_PORT}: {exc}", pytrace=False)
    # Found by the running Prometheus through file-based discovery, as a worker would be.
    sd_dir = Settings.from_env().prometheus_sd_dir
    try:
        with discovery.registered(sd_dir, "worker", f"127.0.0.1:{SCRAPE_PORT}"):
            yield m
    finally:
        server.shutdown()
        server.server_close()


def _wait_for_scrape(prometheus_url: str, world: str) -> None:
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    query = f'causeway_world_last_commit_timestamp_seconds{{world="{world}"}}'
    while time.monotonic() < deadline:
        body = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5).json()
        if body["data"]["result"]:
            return
        time.sleep(0.5)
    targets = httpx.get(f"{prometheus_url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    ours = [t for t in targets if t["scrapeUrl"].endswith(f":{SCRAPE_PORT}/metrics")]
    pytest.fail(f"Prometheus did not scrape 127.0.0.1:{SCRAPE_PORT} within {SCRAPE_TIMEOUT_S:.0f}s: {ours}")


def test_every_panel_query_parses_and_returns_data_unless_documented_empty(
    prometheus_url: str, metrics_endpoint: Metrics, unique: str
) -> None:
    world, topic = f"dash-{unique}", f"dash.{unique}"
    load = SteadyLoad(metrics_endpoint, metrics_endpoint.lag, world, topic)  # type: ignore[attr-defined]
    load.start()
    try:
        _wait_for_scrape(prometheus_url, world)
        variables = {"world": promql_check.regex_value(world), "topic": promql_check.regex_value(topic)}
        queries = promql_check.panel_queries()
        # rate() needs two scrapes inside its window: poll until the expected data is there.
        deadline = time.monotonic() + DATA_TIMEOUT_S
        while True:
            results = promql_check.check_live(prometheus_url, queries, variables)
            if all(r.acceptable for r in results) or time.monotonic() > deadline:
                break
            time.sleep(2)
    finally:
        load.stopped.set()
        load.join(5)

    # With the variables at "All" (.*), as a dashboard opens, every query must parse as well.
    all_worlds = promql_check.check_live(prometheus_url, queries)
    assert all(r.ok for r in all_worlds), promql_check.report(r for r in all_worlds if not r.ok)

    report = promql_check.report(results)
    print(f"\n{report}")
    assert len(results) == len(queries) > 0
    failed = [r for r in results if not r.ok]
    assert not failed, f"queries that Prometheus rejected:\n{report}"
    missing = [r for r in results if not r.acceptable]
    assert not missing, f"queries without data that are not documented as empty at rest:\n{report}"
