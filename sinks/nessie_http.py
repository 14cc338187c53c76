"""Kept HTTP/1.1 connections for the synchronous Nessie client (the committer's two round trips).

Why not httpx here: httpx.Client spends ~1.6-2.3 ms of client CPU on a small Nessie request (URL
merging and parsing, Request/Response models, cookie extraction, the pool, h11's event machine);
the bytes on the wire need ~0.3 ms (docs/benchmarks.md, "2026-12-02 small hours"). Nessie's answers
are small JSON with a length or chunked framing, so the few rules needed are written out here.

What httpx gave and this keeps, because ``sinks.nessie.RetryPolicy`` depends on it:

- failures raise httpx's own ``TransportError`` classes with httpx's meaning: ``ConnectError`` and
  ``ConnectTimeout`` only while connecting (TLS handshake included), before any byte of the request
  was written; ``WriteError``/``WriteTimeout``, ``ReadError``/``ReadTimeout`` and
  ``RemoteProtocolError`` once it may have been sent, so an unsafe call is never resent after those;
- a kept connection is checked before reuse (readable while idle = the server closed it or sent
  something unasked: dropped, as httpcore does) and not reused after ``KEEPALIVE_S`` idle;
- TLS through the client's ``ssl.SSLContext`` (a CA file or mutual TLS, streams.security), with the
  server name checked; the timeout applies to connecting and to each write and read, as httpx's.

Not kept: proxies from the environment (httpx's ``trust_env``) and redirects (the Nessie client never
followed them). The async client stays on httpx (docs/architecture.md, "The Nessie client").
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx

KEEPALIVE_S = 5.0
"""An idle connection older than this is closed rather than reused (httpx's default expiry)."""

MAX_IDLE = 10
"""Idle connections kept (one per commit thread is enough; httpx keeps up to 20)."""

_MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its status and its whole (decoded) body."""

    status_code: int
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


def ssl_context(verify: Any) -> ssl.SSLContext:
    """The context for httpx's ``verify`` values: True (system CAs), a context, a CA path, False."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)


class _Connection:
    """One socket with the bytes read past the last answer (none, when answers are framed)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.idle_since = time.monotonic()

    def reusable(self) -> bool:
        """False when it was idle too long, or the server closed it (an idle socket with something
        to read has an EOF or bytes nobody asked for)."""
        if time.monotonic() - self.idle_since > KEEPALIVE_S or self.buffer:
            return False
        poll = select.poll()  # not select.select: a worker may hold fds past 1024
        poll.register(self.sock, select.POLLIN)
        return not poll.poll(0)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def recv(self) -> bytes:
        try:
            data = self.sock.recv(65536)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "timed out") from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        if not data:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return data

    def read_until(self, mark: bytes) -> bytes:
        while (end := self.buffer.find(mark)) < 0:
            if len(self.buffer) > _MAX_HEAD:
                raise httpx.RemoteProtocolError("answer head too long")
            self.buffer += self.recv()
        head = bytes(self.buffer[:end])
        del self.buffer[: end + len(mark)]
        return head

    def read_exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self.buffer += self.recv()
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def read_to_eof(self) -> bytes:
        chunks = [bytes(self.buffer)]
        self.buffer.clear()
        try:
            while True:
                chunks.append(self.recv())
        except httpx.RemoteProtocolError:  # EOF ends a close-delimited body
            return b"".join(chunks)


def _read_chunked(conn: _Connection) -> bytes:
    chunks: list[bytes] = []
    while True:
        size_line = conn.read_until(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad chunk size {size_line[:40]!r}") from None
        if size == 0:
            while conn.read_until(b"\r\n"):  # trailers, up to the empty line
                pass
            return b"".join(chunks)
        chunks.append(conn.read_exactly(size))
        if conn.read_exactly(2) != b"\r\n":
            raise httpx.RemoteProtocolError("chunk not followed by CRLF")


def read_answer(conn: _Connection, method: str) -> tuple[Answer, bool]:
    """The next answer on ``conn`` (skipping 1xx) and whether the connection may be reused."""
    while True:
        status_line, *lines = conn.read_until(b"\r\n\r\n").split(b"\r\n")
        version, _, rest = status_line.partition(b" ")
        try:
            status = int(rest[:3])
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad status line {status_line[:60]!r}") from None
        if not version.startswith(b"HTTP/1."):
            raise httpx.RemoteProtocolError(f"bad status line {status_line[:60]!r}")
        if not 100 <= status < 200:
            break
    headers: dict[bytes, bytes] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError(f"bad header line {line[:60]!r}")
        key = name.strip().lower()
        headers[key] = headers[key] + b", " + value.strip() if key in headers else value.strip()
    keep = version == b"HTTP/1.1" and b"close" not in headers.get(b"connection", b"").lower()
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        body = _read_chunked(conn)
    elif (length := headers.get(b"content-length")) is not None:
        try:
            body = conn.read_exactly(int(length))
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad Content-Length {length[:20]!r}") from None
    elif status in (204, 304) or method == "HEAD":
        body = b""
    else:  # neither length nor chunks: the body runs to the end of the connection
        body, keep = conn.read_to_eof(), False
    encoding = headers.get(b"content-encoding", b"identity").lower()
    if encoding in (b"gzip", b"deflate"):  # not asked for; decoded should a proxy send it anyway
        body = zlib.decompress(body, 47 if encoding == b"gzip" else 15)
    elif encoding != b"identity":
        raise httpx.DecodingError(f"unsupported Content-Encoding {encoding!r}")
    return Answer(status, body), keep


class KeptConnections:
    """HTTP/1.1 requests to one origin over kept connections, safe to share between threads.

    ``base_url`` is ``http[s]://host[:port][/prefix]``; ``request`` takes a path under the prefix.
    """

    def __init__(self, base_url: str, *, timeout: float, headers: dict[str, str], verify: Any = True) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {url.scheme}://{url.hostname}")
        self.host = url.hostname
        self.tls = url.scheme == "https"
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path.rstrip("/")
        self.timeout = timeout
        self._context = ssl_context(verify) if self.tls else None
        default_port = self.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        fixed = {"Host": host if default_port else f"{host}:{self.port}", "User-Agent": "causeway"} | headers
        self._head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self.opened = 0
        """Connections opened so far (the test of reuse)."""

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: bytes | None = None,
        authorization: str | None = None,
    ) -> Answer:
        """One request and its whole answer; raises httpx.TransportError subclasses (see module)."""
        target = self.prefix + path + (f"?{urlencode(params)}" if params else "")
        head = f"{method} {target} HTTP/1.1\r\n{self._head}"
        if authorization:
            head += f"Authorization: {authorization}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        elif method in ("POST", "PUT", "PATCH"):
            head += "Content-Length: 0\r\n"
        data = (head + "\r\n").encode("ascii") + (body or b"")
        conn = self._take()
        try:
            try:
                conn.sock.sendall(data)
            except TimeoutError as exc:
                raise httpx.WriteTimeout(str(exc) or "timed out") from exc
            except OSError as exc:
                raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
            answer, keep = read_answer(conn, method)
        except BaseException:
            conn.close()
            raise
        self._give_back(conn, keep)
        return answer

    def _take(self) -> _Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect()
            if conn.reusable():
                return conn
            conn.close()

    def _give_back(self, conn: _Connection, keep: bool) -> None:
        if keep and not conn.buffer:
            conn.idle_since = time.monotonic()
            with self._lock:
                if len(self._idle) < MAX_IDLE:
                    self._idle.append(conn)
                    return
        conn.close()

    def _connect(self) -> _Connection:
        """A new connection; every failure here is before the request: ConnectError/ConnectTimeout."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self.host)
        except TimeoutError as exc:
            sock.close()
            raise httpx.ConnectTimeout(str(exc) or "timed out") from exc
        except OSError as exc:  # ssl.SSLError included: a certificate that does not verify
            sock.close()
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        with self._lock:
            self.opened += 1
        return _Connection(sock)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
