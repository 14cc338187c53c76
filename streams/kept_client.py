"""A client kept between the rounds of a periodic probe, opened again after a failure.

A probe that asks a service something every few seconds (the worker's dependency watcher behind
``/health``, the lag exporter's offset polls) should not open a connection per round: a Kafka client
bootstraps (TCP, and TLS and SASL on a secured broker) and a Redis client connects and authenticates
each time, and a busy server sees a connection churn per probing process. ``KeptClient`` opens its
client on first use and keeps it; a call that fails closes it, so the next call opens a fresh one
(a broker or server that came back is found again, whatever state the old client was left in).

A kept connection can also fail while the service is up (the server restarted or closed an idle
connection): a call on a client kept from an earlier round is tried once more on a fresh client
before its failure counts, so a probe's verdict is a fresh client's, as when it opened one per round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

C = TypeVar("C")
T = TypeVar("T")

#: Closing a failed client must not hold up the probe that reports the failure.
CLOSE_TIMEOUT_S = 1.0


class KeptClient(Generic[C]):
    """One client of a service, opened by ``open`` on first use and kept until a call fails.

    ``open`` returns a ready client or raises (cleaning up what it started); ``close`` releases one.
    """

    def __init__(self, open: Callable[[], Awaitable[C]], close: Callable[[C], Awaitable[object]]) -> None:
        self._open = open
        self._close = close
        self._client: C | None = None
        self.opened = 0  # clients opened so far: one for the process's life while the service answers

    async def call(self, use: Callable[[C], Awaitable[T]]) -> T:
        """``use(client)`` on the kept client (opened if there is none); a failure closes the client and
        raises, after one more try on a fresh client if the failed one was kept from an earlier call."""
        kept = self._client is not None
        try:
            return await use(await self._get())
        except Exception:
            await self.reset()
            if not kept:
                raise
        except BaseException:  # cancelled mid-call (a probe's timeout): the client's state is unknown
            await self.reset()
            raise
        log.debug("a kept client failed; trying once on a fresh one", exc_info=True)
        try:
            return await use(await self._get())
        except BaseException:
            await self.reset()
            raise

    async def _get(self) -> C:
        if self._client is None:
            self._client = await self._open()
            self.opened += 1
        return self._client

    async def reset(self) -> None:
        """Close the kept client, if any; the next call opens a fresh one."""
        client, self._client = self._client, None
        if client is None:
            return
        # A close that fails or hangs only loses a connection the server drops anyway; a cancellation
        # arriving meanwhile goes through (a stopping worker's watcher must end).
        try:
            await asyncio.wait_for(self._close(client), CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - closing a broken client must not mask the first error
            log.debug("closing a kept client failed: %s: %s", type(exc).__name__, exc)

    async def aclose(self) -> None:
        await self.reset()
