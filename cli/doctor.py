"""`causeway doctor`: a real round trip through each service, with timings."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine

import httpx
import redis

from agents.probes import ProbeResult, probe_kafka, probe_nessie, probe_redis
from cli.errors import mask_url
from cli.preflight import url_of
from monitoring.discovery import describe_targets
from streams.security import (
    KafkaFailureLog,
    describe_kafka,
    describe_nessie,
    describe_redis,
    explain_failure,
    kafka_client_options,
    nessie_http_options,
    redact,
    redis_options,
    secret_values,
    security_reason,
)
from streams.settings import Settings
from streams.topics import ensure_topic

PROBE_TIMEOUT_S = 5.0
PROBES: dict[str, Callable[[Settings, float], Coroutine[None, None, ProbeResult]]] = {
    "kafka": probe_kafka,
    "redis": probe_redis,
    "nessie": probe_nessie,
}


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
    return f"SET/GET with TTL at {mask_url(settings.redis_url)}"


async def _kafka_round_trip(settings: Settings) -> str:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    topic = "causeway.doctor"
    await ensure_topic(settings, topic)  # created up front: auto-creation on produce logs an ERROR first
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=10_000, **kafka_client_options(settings)
    )
    await producer.start()
    try:
        token = uuid.uuid4().hex.encode()
        meta = await producer.send_and_wait(topic, token, key=b"doctor")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, **kafka_client_options(settings)
    )
    await consumer.start()
    try:
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


def _classify_prometheus(settings: Settings) -> str:
    try:
        return _check_prometheus(settings)
    except httpx.ConnectError as exc:
        raise _Down(f"not running there: {exc}") from exc
    except (httpx.HTTPStatusError, ValueError, KeyError) as exc:
        raise _Wrong(f"answers, but not as Prometheus: {' '.join(str(exc).split())[:200]}") from exc


class _Down(Exception):
    """Nothing answers at the URL (not running, or the host/port is wrong)."""


class _Wrong(Exception):
    """Something answers at the URL, but it is not the service (the URL points elsewhere)."""


class _Refused(Exception):
    """The service answers but refuses the credentials or the TLS handshake (message names which)."""


def _probed(settings: Settings, service: str, round_trip: Callable[[], str]) -> Callable[[], str]:
    """First the bounded probe that tells "not running" from "not that service", then the round trip."""

    def check() -> str:
        with KafkaFailureLog() as kafka_log:
            result = asyncio.run(PROBES[service](settings, PROBE_TIMEOUT_S))
        # A refused password, user, certificate or token is neither "not running" nor "not that service".
        refused = result.verdict != "ok" and security_reason(f"{kafka_log.last} {result.detail}")
        if refused:
            raise _Refused(result.detail if result.detail.startswith(refused) else f"{refused} ({result.detail})")
        if result.verdict == "down":
            raise _Down(f"not running at {mask_url(url_of(settings, service))}: {result.detail}")
        if result.verdict == "wrong":
            raise _Wrong(f"{mask_url(url_of(settings, service))} answers, but is not {service}: {result.detail}")
        return round_trip()

    return check


def run_checks(settings: Settings, echo: Callable[[str], None] = print) -> bool:
    """Check each service; one line each: ``ok``, ``DOWN`` (not running) or ``WRONG`` (not that service)."""
    checks: list[tuple[str, Callable[[], str]]] = [
        ("kafka", _probed(settings, "kafka", lambda: asyncio.run(_kafka_round_trip(settings)))),
        ("redis", _probed(settings, "redis", lambda: _check_redis(settings))),
        ("nessie", _probed(settings, "nessie", lambda: _check_nessie(settings))),
        ("prometheus", lambda: _classify_prometheus(settings)),
    ]
    all_ok = True
    modes = {"kafka": describe_kafka(settings), "redis": describe_redis(settings), "nessie": describe_nessie(settings)}
    quiet = logging.getLogger("aiokafka")
    propagate = quiet.propagate
    # Its connection errors would repeat our line; not propagated, they still reach KafkaFailureLog.
    quiet.propagate = False
    try:
        for name, check in checks:
            start = time.perf_counter()
            mode = f" [{modes[name]}]" if name in modes else ""
            try:
                detail = check()
                echo(f"  ok    {name:11} {detail} ({(time.perf_counter() - start) * 1000:.0f} ms){mode}")
            except _Down as exc:
                all_ok = False
                echo(f"  DOWN  {name:11} {exc}{mode}")
            except _Wrong as exc:
                all_ok = False
                echo(f"  WRONG {name:11} {exc}{mode}")
            except _Refused as exc:
                all_ok = False
                echo(f"  FAIL  {name:11} {redact(str(exc), secret_values(settings))}{mode}")
            except Exception as exc:  # noqa: BLE001 - the point is to report any failure by service
                all_ok = False
                echo(f"  FAIL  {name:11} {explain_failure(exc, settings)}{mode}")
    finally:
        quiet.propagate = propagate
    return all_ok
