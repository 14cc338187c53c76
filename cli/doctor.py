"""`causeway doctor`: a real round trip through each service, with timings."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import httpx
import redis

from monitoring.discovery import describe_targets
from streams.security import (
    KafkaFailureLog,
    describe_kafka,
    describe_nessie,
    describe_redis,
    explain_failure,
    kafka_client_options,
    nessie_http_options,
    redis_options,
)
from streams.settings import Settings


def _check_redis(settings: Settings) -> str:
    client = redis.Redis.from_url(
        settings.redis_url, socket_timeout=5, socket_connect_timeout=5, **redis_options(settings)
    )
    key = f"causeway:doctor:{uuid.uuid4().hex}"
    client.set(key, b"ok", ex=30)
    value = client.get(key)
    client.delete(key)
    if value != b"ok":
        raise RuntimeError(f"read back {value!r}")
    return f"SET/GET with TTL at {settings.redis_url}"


async def _kafka_round_trip(settings: Settings) -> str:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    topic = "causeway.doctor"
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=10_000, **kafka_client_options(settings)
    )
    try:
        await producer.start()
        token = uuid.uuid4().hex.encode()
        meta = await producer.send_and_wait(topic, token, key=b"doctor")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, **kafka_client_options(settings)
    )
    try:
        await consumer.start()
        tp = TopicPartition(topic, meta.partition)
        consumer.assign([tp])
        consumer.seek(tp, meta.offset)
        records = await consumer.getmany(tp, timeout_ms=10_000)
        values = [r.value for r in records.get(tp, [])]
    finally:
        await consumer.stop()
    if token not in values:
        raise RuntimeError("produced record was not read back")
    return f"produced and consumed offset {meta.offset} on {topic}[{meta.partition}]"


def _check_nessie(settings: Settings) -> str:
    headers = {"Nessie-Client-Spec": "2"}
    with httpx.Client(
        base_url=settings.nessie_url, headers=headers, timeout=10, **nessie_http_options(settings)
    ) as http:
        spec = http.get("/config").raise_for_status().json()["specVersion"]
        main = http.get(f"/trees/{settings.main_branch}").raise_for_status().json()["reference"]
        log = http.get(f"/trees/{settings.main_branch}/history", params={"max-records": 1}).raise_for_status()
        n = len(log.json()["logEntries"])
    return f"spec {spec}, {settings.main_branch}@{main['hash'][:12]}, history readable ({n} entry)"


def _check_prometheus(settings: Settings) -> str:
    resp = httpx.get(f"{settings.prometheus_url}/api/v1/query", params={"query": "up"}, timeout=10)
    resp.raise_for_status()
    return f"query `up` answered: {describe_targets(resp.json()['data']['result'])}"


def run_checks(settings: Settings, echo: Callable[[str], None] = print) -> bool:
    modes = {"kafka": describe_kafka(settings), "redis": describe_redis(settings), "nessie": describe_nessie(settings)}
    checks: list[tuple[str, Callable[[], str]]] = [
        ("kafka", lambda: asyncio.run(_kafka_round_trip(settings))),
        ("redis", lambda: _check_redis(settings)),
        ("nessie", lambda: _check_nessie(settings)),
        ("prometheus", lambda: _check_prometheus(settings)),
    ]
    all_ok = True
    for name, check in checks:
        start = time.perf_counter()
        mode = f" [{modes[name]}]" if name in modes else ""
        try:
            with KafkaFailureLog() as kafka_log:
                detail = check()
            echo(f"  ok    {name:11} {detail} ({(time.perf_counter() - start) * 1000:.0f} ms){mode}")
        except Exception as exc:  # noqa: BLE001 - the point is to report any failure by service
            all_ok = False
            echo(f"  FAIL  {name:11} {explain_failure(exc, settings, kafka_log.last)}{mode}")
    return all_ok
