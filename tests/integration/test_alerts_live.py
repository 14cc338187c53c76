"""The alert rules against a real worker, the real lag exporter and a real Prometheus.

The test starts its own Prometheus process (on a free port, with the config ``scripts/services.sh
prometheus-config`` generates, its own discovery folder, 1 s scrape and evaluation intervals and the
project's rule files unchanged), so it never reconfigures the shared one. The worker and the lag
exporter register themselves in the discovery folder, exactly as under ``scripts/services.sh``.

* A first-ever dead-letter reason fires ``CausewayDeadLetters`` (its series starts at 0).
* SIGSTOP the worker while records keep arriving: the lag exporter, outside the worker, keeps
  measuring, and ``CausewayConsumerLagSecondsHigh`` goes firing within its ``for:`` plus two evaluation
  intervals of going pending, naming the topic and the group. SIGCONT: it resolves.
* An idle world that receives events again does not fire ``CausewayWorldStale`` (pending or firing).
* ``promtool check metrics`` is clean on the worker's ``/metrics``; ``up{job="causeway"}`` has exactly
  the running worker, and its discovery file goes away when it stops.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.integration.pipeline import ROOT, Pipeline, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INTERVAL_S = 1  # scrape and evaluation interval of the test's own Prometheus
LAG_SECONDS_FOR_S = 60  # CausewayConsumerLagSecondsHigh: for: 1m
LAG_SECONDS_THRESHOLD_S = 60
SLACK_S = 3  # this test's own polling of /api/v1/alerts (every 0.5 s) and one HTTP round trip


def _event(world: str, pk: str) -> tuple[bytes, bytes]:
    doc = {
        "event_id": f"{pk}-{uuid.uuid4().hex[:12]}",
        "world_id": world,
        "object_type": "Probe",
        "object_pk": pk,
        "change_type": "CREATE",
        "after_properties": {"n": 1},
        "version": 1,
        "occurred_at": int(time.time() * 1000),
        "caused_by": None,
    }
    return f"{world}::{pk}".encode(), orjson.dumps(doc)


async def _publish(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


class Prom:
    """A private Prometheus process for this test."""

    def __init__(self, tmp: Path, sd_dir: Path) -> None:
        if shutil.which("prometheus") is None:
            pytest.fail("prometheus is not installed; scripts/services.sh fetch installs it", pytrace=False)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "CAUSEWAY_PROMETHEUS_SD_DIR": str(sd_dir),
            "CAUSEWAY_PROMETHEUS_PORT": str(self.port),
            "CAUSEWAY_SCRAPE_INTERVAL": f"{INTERVAL_S}s",
        }
        config = subprocess.run(
            [str(ROOT / "scripts" / "services.sh"), "prometheus-config"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        conf = tmp / "prometheus.yml"
        conf.write_text(config)
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={conf}",
                f"--storage.tsdb.path={tmp / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        pytest.fail(f"private Prometheus not ready: {self.log.read_text()[-2000:]}", pytrace=False)

    def alerts(self, name: str) -> list[dict]:
        resp = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).raise_for_status()
        return [a for a in resp.json()["data"]["alerts"] if a["labels"]["alertname"] == name]

    def query(self, expr: str) -> list[dict]:
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).raise_for_status()
        return resp.json()["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _wait_for(what: str, check, timeout: float, poll: float = 0.5):  # noqa: ANN001, ANN202 - test helper
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _rfc3339(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()  # Prometheus's activeAt: RFC 3339 with nanoseconds


@pytest.fixture
def stack(unique: str, tmp_path: Path, kafka_bootstrap: str, nessie_url: str, redis_url: str) -> Iterator[dict]:
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    pipeline = asyncio.run(
        Pipeline.create(
            unique,
            tmp_path,
            prometheus_sd_dir=str(sd_dir),
            lag_poll_interval_s=1.0,
            lag_exporter_port=free_port(),
            batch_max_seconds=1.0,
            reconcile_interval_s=0.0,
        )
    )
    prom = Prom(tmp_path, sd_dir)
    exporter_log = tmp_path / "lag-exporter.log"
    exporter = subprocess.Popen(
        [sys.executable, "-m", "monitoring.lag_exporter"],
        cwd=ROOT,
        env=pipeline.env,
        stdout=exporter_log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        yield {"pipeline": pipeline, "prom": prom, "sd_dir": sd_dir, "exporter": exporter, "exporter_log": exporter_log}
    finally:
        for w in pipeline.workers:
            if w.alive():
                w.proc.send_signal(signal.SIGCONT)
        pipeline.stop_all()
        exporter.terminate()
        exporter.wait(timeout=30)
        prom.stop()


def test_alerts_fire_when_they_matter_and_stay_quiet_when_they_do_not(stack: dict, unique: str, promtool: str) -> None:
    pipeline: Pipeline = stack["pipeline"]
    prom: Prom = stack["prom"]
    s = pipeline.settings
    objects, group = s.objects_topic, s.app_id
    busy, idle = f"t{unique[:8]}-busy", f"t{unique[:8]}-idle"

    worker = pipeline.start_worker()
    asyncio.run(
        _publish(
            s.kafka_bootstrap,
            objects,
            [_event(busy, f"b{i}") for i in range(20)] + [_event(idle, f"i{i}") for i in range(20)],
        )
    )
    asyncio.run(pipeline.wait_drained(timeout=120))

    # Discovery: exactly the running worker and the exporter are scraped.
    _wait_for("the worker and the exporter scraped", lambda: len(prom.query('up{job=~"causeway.*"} == 1')) == 2, 60)
    assert len(prom.query('up{job="causeway"}')) == 1

    # promtool check metrics on the worker's own exposition.
    text = worker.metrics_text()
    assert "causeway_dead_letters_total" in text and "faust_" not in text
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    # 1. A dead-letter reason this worker has never seen fires at once (no for:).
    asyncio.run(_publish(s.kafka_bootstrap, objects, [(f"{busy}::x".encode(), b"{not json")]))
    fired = _wait_for(
        "CausewayDeadLetters for malformed-json",
        lambda: [
            a
            for a in prom.alerts("CausewayDeadLetters")
            if a["state"] == "firing" and a["labels"].get("reason") == "malformed-json"
        ],
        timeout=60,
    )
    assert fired[0]["labels"]["topic"] == objects

    # 2. Stall the worker while records keep arriving: the lag alert comes from the exporter.
    worker.proc.send_signal(signal.SIGSTOP)
    stalled_at = time.time()
    asyncio.run(_publish(s.kafka_bootstrap, objects, [_event(busy, f"s{i}") for i in range(30)]))

    def lag_alert(state: str) -> list[dict]:
        return [
            a
            for a in prom.alerts("CausewayConsumerLagSecondsHigh")
            if a["state"] == state and a["labels"].get("topic") == objects and a["labels"].get("group") == group
        ]

    pending = _wait_for("the time-lag alert pending", lambda: lag_alert("pending") or lag_alert("firing"), timeout=150)
    active_at = _rfc3339(pending[0]["activeAt"])
    # Pending once the oldest waiting record is 60 s old: the exporter's poll, a scrape and an evaluation.
    assert LAG_SECONDS_THRESHOLD_S - 1 <= active_at - stalled_at, (active_at, stalled_at)  # not before 60 s
    assert active_at - stalled_at <= LAG_SECONDS_THRESHOLD_S + 3 * INTERVAL_S + 5, (active_at, stalled_at)
    firing = _wait_for("the time-lag alert firing", lambda: lag_alert("firing"), timeout=LAG_SECONDS_FOR_S + 30)
    seen_firing = time.time()
    assert seen_firing - active_at <= LAG_SECONDS_FOR_S + 2 * INTERVAL_S + SLACK_S, (seen_firing, active_at)
    assert firing[0]["labels"]["severity"] == "warning"
    # The stall also reads as lag in messages from the exporter, while the worker answers no scrape.
    assert prom.query(f'causeway_consumer_lag_messages{{group="{group}",topic="{objects}"}} > 0')
    assert prom.query('up{job="causeway"} == 0')

    # 3. Resume: the alert resolves once the worker commits.
    worker.proc.send_signal(signal.SIGCONT)
    _wait_for(
        "the time-lag alert resolved",
        lambda: not prom.alerts("CausewayConsumerLagSecondsHigh"),
        timeout=90,
    )

    # 4. The idle world (nothing since the first wave, minutes ago) receives events again: not stale.
    for wave in range(8):
        asyncio.run(_publish(s.kafka_bootstrap, objects, [_event(idle, f"w{wave}-{i}") for i in range(10)]))
        assert not prom.alerts("CausewayWorldStale"), prom.alerts("CausewayWorldStale")
        time.sleep(0.7)
    asyncio.run(pipeline.wait_drained(timeout=120))
    for _ in range(6):
        assert not [a for a in prom.alerts("CausewayWorldStale") if a["labels"].get("world") == idle]
        time.sleep(INTERVAL_S)
    assert prom.query(f'causeway_inflight_events{{world="{idle}"}}'), "the idle world's in-flight series exists"

    # The worker's discovery file goes when it stops; then Prometheus has no worker target.
    pipeline.stop_all()
    assert not list(stack["sd_dir"].glob("worker-*.json"))
    _wait_for("no worker target", lambda: not prom.query('up{job="causeway"}'), timeout=60)


SERVED_WORLDS = 3
OTHER_WORLDS = 200


def test_series_are_bounded_by_the_served_worlds(unique: str, tmp_path: Path, nessie_url: str) -> None:
    from monitoring.metrics import series_bound

    pipeline = asyncio.run(Pipeline.create(unique, tmp_path, reconcile_interval_s=3.0, batch_max_seconds=0.5))
    s = pipeline.settings
    headers = {"Nessie-Client-Spec": "2"}
    created: list[tuple[str, str]] = []
    with httpx.Client(base_url=s.nessie_url, headers=headers, timeout=30) as http:
        root = http.get("/config").raise_for_status().json()["noAncestorHash"]
        try:
            for i in range(OTHER_WORLDS):  # other teams' worlds: branches this worker has no events for
                name = f"world-t{unique[:8]}-other{i}"
                body = {"type": "BRANCH", "name": "main", "hash": root}
                http.post("/trees", params={"name": name, "type": "BRANCH"}, json=body).raise_for_status()
                created.append((name, root))
            served = [f"t{unique[:8]}-s{i}" for i in range(SERVED_WORLDS)]
            worker = pipeline.start_worker()
            asyncio.run(
                _publish(s.kafka_bootstrap, s.objects_topic, [_event(w, f"{w}-{k}") for w in served for k in range(5)])
            )
            asyncio.run(pipeline.wait_drained(timeout=120))
            bound = series_bound(SERVED_WORLDS, topics=2, object_types=1)

            def series() -> int:
                return sum(1 for ln in worker.metrics_text().splitlines() if ln and not ln.startswith("#"))

            reconciled: set[str] = set()
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and reconciled != set(served):
                count = series()
                assert count <= bound, f"{count} series > bound {bound} with {SERVED_WORLDS} served worlds"
                text = worker.metrics_text()
                reconciled = {w for w in served if f'_reconciliation_last_run_timestamp_seconds{{world="{w}"}}' in text}
                time.sleep(1)
            assert reconciled == set(served), "no reconciliation pass reached the served worlds"
            time.sleep(2 * s.reconcile_interval_s)  # one more pass: out-of-scope worlds would show now
            assert series() <= bound
        finally:
            pipeline.stop_all()
            for name, hash_ in created:
                http.delete(f"/trees/{name}@{hash_}")
