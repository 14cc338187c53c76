"""A command's start-up check: the services it needs answer, and are what their URLs claim.

Run before any work, so a command with a service down or mis-pointed fails in a bounded time
(``PREFLIGHT_TIMEOUT_S``, the probes run concurrently) with one line, instead of hanging in a retry
loop or failing half-way. The checks are ``agents.probes``: the same as ``causeway doctor``'s
first step and the worker's ``/health``.
"""

from __future__ import annotations

import asyncio
import logging

from agents.probes import ProbeResult, probe_all
from cli.errors import CommandError, Exit, mask_url
from streams.security import security_reason
from streams.settings import Settings

#: Seconds a probe may take before its service counts as down (documented in docs/operations.md).
PREFLIGHT_TIMEOUT_S = 5.0

_SETTING = {"kafka": "CAUSEWAY_KAFKA_BOOTSTRAP", "redis": "CAUSEWAY_REDIS_URL", "nessie": "CAUSEWAY_NESSIE_URL"}
_NAME = {"kafka": "Kafka", "redis": "Redis", "nessie": "Nessie"}


def url_of(settings: Settings, service: str) -> str:
    return {"kafka": settings.kafka_bootstrap, "redis": settings.redis_url, "nessie": settings.nessie_url}[service]


def failure_line(settings: Settings, result: ProbeResult) -> str:
    """``Nessie unavailable at URL: <detail>; <what to check>`` for a failed probe."""
    service, name = result.service, _NAME[result.service]
    url = mask_url(url_of(settings, service))
    if security_reason(result.detail):  # it answers, and refuses us (the probes put the reason first)
        return f"{name} at {url} refused the connection: {result.detail}; check the {name} settings in docs/security.md"
    if result.verdict == "down":
        check = f"is {name} running there? (`causeway doctor`; {_SETTING[service]})"
        return f"{name} unavailable at {url}: {result.detail}; {check}"
    return f"{url} is not {name}: {result.detail}; something else answers there: check {_SETTING[service]}"


def require(settings: Settings, *services: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> None:
    """Raise CommandError (exit 4) naming the first failed service; return when all answer."""
    quiet = logging.getLogger("aiokafka")
    propagate = quiet.propagate
    if not quiet.isEnabledFor(logging.DEBUG):
        # Its "Unable connect to ..." line would repeat ours; not propagated, the Kafka probe still
        # reads it (a refused password or certificate is named only there).
        quiet.propagate = False
    try:
        results = asyncio.run(probe_all(settings, services, timeout_s))
    finally:
        quiet.propagate = propagate
    failed = [r for r in results if not r.ok]
    if failed:
        raise CommandError("; ".join(failure_line(settings, r) for r in failed), Exit.UNAVAILABLE)
