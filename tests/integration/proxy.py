"""A TCP proxy on loopback that a test can cut and restore, to take a real service "down" for one
worker without stopping the shared server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlparse


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.accepted = 0  # connections the proxy took: how often a client connected afresh
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def start(self) -> int:
        self.port = self._call(self._listen(self.port))
        return self.port

    async def _listen(self, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> None:
        """Refuse new connections and drop open ones: the service looks down."""
        self._call(self._cut())

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self._call(self._listen(self.port))

    def close(self) -> None:
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


def proxied(url: str) -> tuple[CuttableProxy, str]:
    """A started proxy to the service at ``url``, and ``url`` with its port replaced by the proxy's."""
    parsed = urlparse(url)
    proxy = CuttableProxy(parsed.hostname or "127.0.0.1", parsed.port or 0)
    return proxy, url.replace(f":{parsed.port}", f":{proxy.start()}", 1)
