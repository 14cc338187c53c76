"""Smoke tests: one round trip through each real service. Each fails if its service is absent."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from monitoring import discovery
from streams.settings import Settings

pytestmark = pytest.mark.integration


async def test_kafka_keyed_round_trip_over_partitions(kafka_bootstrap: str, unique: str) -> None:
    topic = f"smoke.{unique}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    sent: dict[bytes, int] = {}
    try:
        for i in range(30):
            key = f"w1::obj-{i % 7}".encode()
            meta = await producer.send_and_wait(topic, f"v{i}".encode(), key=key)
            # The same key must always land on the same partition.
            assert sent.setdefault(key, meta.partition) == meta.partition
    finally:
        await producer.stop()
    assert len(set(sent.values())) > 1, "7 keys over 3 partitions should use more than one partition"

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest", group_id=f"smoke-{unique}"
    )
    await consumer.start()
    got: list[tuple[bytes, bytes, int]] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < 30 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            for tp, records in batch.items():
                got.extend((r.key, r.value, tp.partition) for r in records)
    finally:
        await consumer.stop()
    assert len(got) == 30
    for key, _value, partition in got:
        assert sent[key] == partition
    # Per-key order survives: values of one key arrive in the order they were sent.
    per_key = [int(v[1:]) for k, v, _ in got if k == b"w1::obj-0"]
    assert per_key == sorted(per_key) and len(per_key) == 5


def test_redis_set_with_ttl(redis_url: str, unique: str) -> None:
    client = redis.Redis.from_url(redis_url)
    key = f"causeway:smoke:{unique}"
    try:
        assert client.set(key, b"hello", ex=60)
        assert client.get(key) == b"hello"
        ttl = client.ttl(key)
        assert 0 < ttl <= 60
    finally:
        client.delete(key)
    assert client.get(key) is None


def test_nessie_branch_commit_and_log(nessie_url: str, unique: str) -> None:
    headers = {"Nessie-Client-Spec": "2"}
    with httpx.Client(base_url=nessie_url, headers=headers, timeout=30) as http:
        main = http.get("/trees/main").raise_for_status().json()["reference"]
        branch = f"smoke-{unique}"
        created = (
            http.post("/trees", params={"name": branch, "type": "BRANCH"}, json={"type": "BRANCH", **main})
            .raise_for_status()
            .json()["reference"]
        )
        try:
            body = {
                "commitMeta": {
                    "message": f"smoke {unique}",
                    "authors": ["causeway-tests"],
                    "allProperties": {"causeway.batch_id": [unique]},
                },
                "operations": [
                    {
                        "type": "PUT",
                        "key": {"elements": [f"smoke_{unique}"]},
                        "content": {"type": "NAMESPACE", "elements": [f"smoke_{unique}"]},
                    }
                ],
            }
            commit = http.post(f"/trees/{branch}@{created['hash']}/history/commit", json=body)
            new_hash = commit.raise_for_status().json()["targetBranch"]["hash"]
            assert new_hash != created["hash"]
            log = http.get(f"/trees/{branch}/history", params={"max-records": 5}).raise_for_status().json()
            first = log["logEntries"][0]["commitMeta"]
            assert first["message"] == f"smoke {unique}"
            assert first["allProperties"]["causeway.batch_id"] == [unique]
            # main did not move.
            assert http.get("/trees/main").json()["reference"]["hash"] == main["hash"]
        finally:
            head = http.get(f"/trees/{branch}").json()["reference"]["hash"]
            http.delete(f"/trees/{branch}@{head}").raise_for_status()


SCRAPE_PORT = 6069  # a static target of older configs; scripts/services.sh now finds it by discovery


def test_prometheus_scrapes_a_target_and_answers(prometheus_url: str, unique: str) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("causeway_smoke_value", "Smoke-test gauge", ["run"], registry=registry)
    gauge.labels(run=unique).set(42)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            payload = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", SCRAPE_PORT), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # Prometheus finds scrape targets through file-based discovery (monitoring/discovery.py).
    entry = discovery.register(Settings.from_env().prometheus_sd_dir, "worker", f"127.0.0.1:{SCRAPE_PORT}")
    try:
        query = f'causeway_smoke_value{{run="{unique}"}}'
        deadline = time.monotonic() + 45
        result: list = []
        while time.monotonic() < deadline and not result:
            resp = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
            resp.raise_for_status()
            result = resp.json()["data"]["result"]
            if not result:
                time.sleep(1)
        assert result, f"Prometheus never scraped 127.0.0.1:{SCRAPE_PORT} (is it in its targets?)"
        assert float(result[0]["value"][1]) == 42.0
        bad = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": "sum(("}, timeout=5)
        assert bad.status_code == 400
    finally:
        discovery.unregister(entry)
        server.shutdown()
        server.server_close()


def test_missing_service_is_an_error_not_a_skip(pytester: pytest.Pytester) -> None:
    """The fixtures fail loudly, naming the start command, when a service is down."""
    pytester.makeconftest("from tests.conftest import *  # noqa\n")
    pytester.makepyfile(
        """
        from tests.conftest import require
        def test_down():
            require("Kafka", "127.0.0.1:1")
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Kafka is not reachable*scripts/services.sh start*"])
