"""Build and run the gRPC server: the world service, standard health checking and reflection, TLS.

``serve(settings)`` runs until SIGTERM/SIGINT, then drains in-flight calls (grace period) and exits.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

import grpc
import redis.asyncio as aioredis
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from api import world_manager_pb2 as pb
from api import world_manager_pb2_grpc as pb_grpc
from api.audit_log import AuditLog
from api.auth import load_tokens
from api.idempotency import IdempotentExecutor
from api.saga_run import ApplyChangesSaga
from api.service import WorldService
from sinks.nessie import NessieClient
from streams.settings import Settings

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["WorldManagerService"].full_name


class ServerConfigError(ValueError):
    """The server cannot start as configured (token file, TLS files); the message says what to fix."""


@dataclass
class Running:
    server: grpc.aio.Server
    port: int
    nessie: NessieClient
    redis: aioredis.Redis
    saga: ApplyChangesSaga

    async def stop(self, grace: float = 5.0) -> None:
        await self.server.stop(grace)
        await self.saga.close()
        await self.nessie.aclose()
        await self.redis.aclose()


def _credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if not settings.api_tls_cert and not settings.api_tls_key:
        return None
    if not (settings.api_tls_cert and settings.api_tls_key):
        raise ServerConfigError("set both CAUSEWAY_API_TLS_CERT and CAUSEWAY_API_TLS_KEY to serve TLS")
    try:
        cert, key = Path(settings.api_tls_cert).read_bytes(), Path(settings.api_tls_key).read_bytes()
    except OSError as exc:
        raise ServerConfigError(f"cannot read the TLS certificate or key: {exc}") from exc
    return grpc.ssl_server_credentials([(key, cert)])


async def start(settings: Settings, bind: str | None = None) -> Running:
    """Start the server on ``bind`` (default ``settings.api_bind``; port 0 picks a free port)."""
    try:
        tokens = load_tokens(settings.api_tokens_file)
    except ValueError as exc:
        raise ServerConfigError(str(exc)) from exc
    creds = _credentials(settings)
    nessie = NessieClient.from_settings(settings)
    redis = aioredis.Redis.from_url(settings.redis_url)
    executor = IdempotentExecutor(
        redis,
        settings.api_redis_prefix,
        ttl_s=settings.api_idempotency_ttl_s,
        lease_s=settings.api_lock_lease_s,
        wait_s=settings.api_inflight_wait_s,
    )
    saga = ApplyChangesSaga(settings)
    service = WorldService(settings, nessie, executor, tokens, AuditLog(settings.api_audit_log), saga.run)
    server = grpc.aio.server()
    pb_grpc.add_WorldManagerServiceServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = bind or settings.api_bind
    port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    if port == 0:
        raise ServerConfigError(f"cannot listen on {address}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "world manager API on %s (port %d, %s, %d token(s))",
        address,
        port,
        "TLS" if creds else "plaintext",
        len(tokens),
    )
    return Running(server, port, nessie, redis, saga)


async def serve(settings: Settings, bind: str | None = None, ready: asyncio.Event | None = None) -> None:
    running = await start(settings, bind)
    print(f"serving on port {running.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("stopping: draining in-flight calls")
    await running.stop()
