"""One bounded probe per dependency (Kafka, Redis, Nessie): the I/O half of ``monitoring.health``.

Each probe does the cheapest real round trip that proves the URL is *that* service and answers:
Kafka a metadata request, Redis ``PING``, Nessie ``GET /config`` checked to be a REST API v2. A probe
never waits longer than its ``timeout_s`` and tells apart

* ``down``: nothing listens there, or it does not answer in time (start it, or fix the host/port);
* ``wrong``: something answered, but not as that service does (the URL points at something else).

``causeway doctor``, the CLI's start-up check and the worker's ``/health`` all use these.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from monitoring.health import Health
from sinks.errors import NessieNotAnApi, NessieUnavailable
from sinks.nessie import Config, NessieClient, RetryPolicy
from streams.kept_client import KeptClient
from streams.security import (
    KafkaFailureLog,
    kafka_client_options,
    nessie_http_options,
    redis_options,
    security_reason,
)
from streams.settings import Settings

Verdict = Literal["ok", "down", "wrong"]


@dataclass(frozen=True)
class ProbeResult:
    service: str
    verdict: Verdict
    detail: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


class NotNessieV2(NessieNotAnApi):
    """The URL is a Nessie server, but not its REST API v2 (e.g. ``/api/v1``)."""


def _nessie_client(settings: Settings, timeout_s: float) -> NessieClient:
    return NessieClient(
        settings.nessie_url, timeout=timeout_s, retry=RetryPolicy(attempts=1), **nessie_http_options(settings)
    )


async def nessie_config(settings: Settings, timeout_s: float, client: NessieClient | None = None) -> Config:
    """``GET /config``, checked to be Nessie's REST API v2; raises NessieNotAnApi or NessieUnavailable.

    ``client``: one the caller keeps open (the dependency watcher's); None opens and closes a fresh one.
    """
    if client is None:
        async with _nessie_client(settings, timeout_s) as fresh:
            return await nessie_config(settings, timeout_s, fresh)
    config = await client.config()
    if config.api_version != 2 or not config.no_ancestor_hash:
        raise NotNessieV2(
            f"/config has no REST v2 fields (actualApiVersion {config.api_version}, "
            f"noAncestorHash {config.no_ancestor_hash or 'missing'}); point the URL at .../api/v2"
        )
    return config


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line (without repeating the type when the message starts with it)."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name


def _refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        if isinstance(seen, OSError) and seen.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
            return True
        text = str(seen)
        if "Connect call failed" in text or "Connection refused" in text or "Unable to bootstrap" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _timed(service: str, timeout_s: float, probe: asyncio.Future[str] | asyncio.Task[str]) -> ProbeResult:
    started = time.perf_counter()
    try:
        detail = await asyncio.wait_for(probe, timeout_s)
    except TimeoutError:
        return ProbeResult(service, "down", f"no answer within {timeout_s:g}s", time.perf_counter() - started)
    except NessieNotAnApi as exc:
        detail = " ".join(f"not a Nessie REST v2 API: {exc}".split())
        return ProbeResult(service, "wrong", detail, time.perf_counter() - started)
    except NessieUnavailable as exc:
        verdict: Verdict = "down" if _refused(exc) or "unreachable" in str(exc) else "wrong"
        result = ProbeResult(service, verdict, " ".join(str(exc).split()), time.perf_counter() - started)
        return _with_reason(result, _chain_text(exc))
    except Exception as exc:  # noqa: BLE001 - a probe reports every failure as its verdict
        verdict = "down" if _refused(exc) else "wrong"
        return _with_reason(
            ProbeResult(service, verdict, describe(exc), time.perf_counter() - started), _chain_text(exc)
        )
    return ProbeResult(service, "ok", detail, time.perf_counter() - started)


def kept_kafka(settings: Settings, timeout_s: float) -> KeptClient[Any]:
    """A Kafka client for probes, bootstrapped on first use and kept (see streams.kept_client)."""

    async def open_client() -> Any:
        from aiokafka.client import AIOKafkaClient

        client = AIOKafkaClient(
            bootstrap_servers=settings.kafka_bootstrap,
            request_timeout_ms=int(timeout_s * 1000),
            **kafka_client_options(settings),
        )
        try:
            await client.bootstrap()
        except BaseException:
            await client.close()
            raise
        return client

    return KeptClient(open_client, lambda client: client.close())


def kept_redis(settings: Settings, timeout_s: float) -> KeptClient[Any]:
    """A Redis client for probes; its pool keeps the connection between rounds (see streams.kept_client)."""

    async def open_client() -> Any:
        import redis.asyncio as aioredis

        return aioredis.Redis.from_url(
            settings.redis_url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            **redis_options(settings),
        )

    return KeptClient(open_client, lambda client: client.aclose())


async def _kafka(kafka: KeptClient[Any]) -> str:
    # A metadata request on the kept connection: a broker itself answers, not only the bootstrap. It
    # asks for the brokers only: the metadata of every topic (what this probe read until 2026-12-03)
    # cost 39 ms of CPU a round at 1,035 topics, growing with the cluster; this costs 0.4 ms.
    from aiokafka.errors import KafkaError
    from aiokafka.protocol.metadata import MetadataRequest

    async def brokers(client: Any) -> Any:
        node = client.get_random_node()
        if node is None:
            raise KafkaError("no broker known to ask")
        return await client.send(node, MetadataRequest([]))  # [] (version 1 and up): no topic

    answer = await kafka.call(brokers)
    return f"{len(answer.brokers)} broker(s) in the metadata"


async def _ping(client: Any) -> str:
    if not await client.ping():
        raise RuntimeError("PING did not answer PONG")
    return "PING answered"


async def _redis(redis: KeptClient[Any]) -> str:
    return await redis.call(_ping)


async def _nessie(settings: Settings, timeout_s: float, client: NessieClient | None = None) -> str:
    config = await nessie_config(settings, timeout_s, client)
    return f"REST API v{config.api_version}, spec {config.spec_version}, default branch {config.default_branch}"


def _with_reason(result: ProbeResult, text: str) -> ProbeResult:
    """Name a refused password, user, certificate or token first in a failed probe's detail."""
    reason = security_reason(f"{text} {result.detail}") if result.verdict != "ok" else ""
    if not reason or result.detail.startswith(reason):
        return result
    return ProbeResult(result.service, result.verdict, f"{reason} ({result.detail})", result.seconds)


def _chain_text(exc: BaseException) -> str:
    parts, seen = [], exc
    for _ in range(8):
        parts.append(f"{type(seen).__name__}: {seen}")
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            break
        seen = nxt
    return " ".join(parts)


async def probe_kafka(settings: Settings, timeout_s: float = 5.0, client: KeptClient[Any] | None = None) -> ProbeResult:
    """``client``: a kept one to probe through (``kept_kafka``); None opens and closes a fresh one."""
    kafka = client if client is not None else kept_kafka(settings, timeout_s)
    try:
        with KafkaFailureLog() as kafka_log:  # aiokafka logs the cause and raises only "Unable to bootstrap"
            result = await _timed("kafka", timeout_s, asyncio.ensure_future(_kafka(kafka)))
    finally:
        if client is None:
            await kafka.aclose()
    return _with_reason(result, kafka_log.last)


async def probe_redis(settings: Settings, timeout_s: float = 5.0, client: KeptClient[Any] | None = None) -> ProbeResult:
    """``client``: a kept one to probe through (``kept_redis``); None opens and closes a fresh one."""
    redis = client if client is not None else kept_redis(settings, timeout_s)
    try:
        return await _timed("redis", timeout_s, asyncio.ensure_future(_redis(redis)))
    finally:
        if client is None:
            await redis.aclose()


async def probe_nessie(settings: Settings, timeout_s: float = 5.0, client: NessieClient | None = None) -> ProbeResult:
    """``client``: a kept-open one to probe through (see ``nessie_config``)."""
    return await _timed("nessie", timeout_s, asyncio.ensure_future(_nessie(settings, timeout_s, client)))


def dependency_watcher(
    health: Health,
    settings: Settings,
    stopping: Callable[[], bool],
    interval_s: float = 5.0,
    timeout_s: float = 3.0,
) -> Callable[[], Awaitable[None]]:
    """Register Kafka, Redis and Nessie in ``health`` (``unknown`` until probed) now, and return the
    loop that probes them every ``interval_s`` into it until ``stopping()``."""
    services = ("kafka", "redis", "nessie")
    for name in services:
        health.register_dependency(name)

    async def watch() -> None:
        # One client per service for the watcher's life: a fresh Nessie client per round built a TLS
        # context and a connection pool, ~47 ms of the event loop's CPU every round (docs/benchmarks.md),
        # and fresh Kafka and Redis clients bootstrapped and connected every round. Nessie's pool opens a
        # dropped connection again by itself; Kafka's and Redis's are opened again after a failed round.
        kafka, redis = kept_kafka(settings, timeout_s), kept_redis(settings, timeout_s)
        try:
            async with _nessie_client(settings, timeout_s) as nessie:
                while not stopping():
                    results = await probe_all(settings, services, timeout_s, nessie=nessie, kafka=kafka, redis=redis)
                    for result in results:
                        detail = "" if result.ok else f"{result.verdict}: {result.detail}"
                        health.set_dependency(result.service, result.ok, detail)
                    await asyncio.sleep(interval_s)
        finally:
            await kafka.aclose()
            await redis.aclose()

    return watch


async def probe_all(
    settings: Settings,
    services: tuple[str, ...],
    timeout_s: float = 5.0,
    *,
    nessie: NessieClient | None = None,
    kafka: KeptClient[Any] | None = None,
    redis: KeptClient[Any] | None = None,
) -> list[ProbeResult]:
    """The named probes (kafka, redis, nessie) concurrently; at most ``timeout_s`` in all.

    ``nessie``, ``kafka``, ``redis``: kept clients to probe through (the dependency watcher's); None
    opens and closes a fresh one.
    """
    probes: dict[str, Callable[[Settings, float], Awaitable[ProbeResult]]] = {
        "kafka": partial(probe_kafka, client=kafka),
        "redis": partial(probe_redis, client=redis),
        "nessie": partial(probe_nessie, client=nessie),
    }
    return list(await asyncio.gather(*(probes[s](settings, timeout_s) for s in services)))
