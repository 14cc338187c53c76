"""The sync Nessie client's own kept connections (sinks.nessie_http) against scripted local servers:
reuse, a connection the server closed, an answer cut off after a commit was sent, framing, OAuth2
refresh and TLS. The retry rules themselves are tested in test_sinks_nessie.py."""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sinks import nessie_http
from sinks.errors import CommitStateUnknown, NessieUnavailable
from sinks.nessie import Operation, RetryPolicy, SyncNessieClient
from streams.security import NessieAuth, tls_context
from streams.settings import Secret, Settings

FAST = RetryPolicy(attempts=4, base_s=0.001, cap_s=0.01)
REF = {"reference": {"type": "BRANCH", "name": "main", "hash": "ab" * 32}}
COMMITTED = {"targetBranch": {"type": "BRANCH", "name": "main", "hash": "cd" * 32}, "addedContents": None}


def _answer(status: int, body: object, *, extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
    return head.encode() + data


class Request:
    def __init__(self, head: bytes, body: bytes, connection: int) -> None:
        line, *lines = head.decode().split("\r\n")
        self.method, self.path, _ = line.split(" ")
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
        self.body, self.connection = body, connection


# What the server does with a request: the bytes to answer, then whether to close; None closes
# the connection without answering.
Script = Callable[[Request], tuple[bytes, bool] | None]


class RawServer:
    """HTTP/1.1 at the socket level: keeps connections open unless the script closes them."""

    def __init__(self, script: Script, context: ssl.SSLContext | None = None) -> None:
        self.script, self.context = script, context
        self.requests: list[Request] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"{'https' if context else 'http'}://127.0.0.1:{self.port}/api/v2"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(sock, self.connections), daemon=True).start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        try:
            if self.context:
                sock = self.context.wrap_socket(sock, server_side=True)
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                request = Request(head, b"", number)
                length = int(request.headers.get("content-length") or 0)
                while len(buffer) < length:
                    buffer += sock.recv(65536)
                request.body, buffer = buffer[:length], buffer[length:]
                self.requests.append(request)
                action = self.script(request)
                if action is None:
                    return
                sock.sendall(action[0])
                if action[1]:
                    return
        except (OSError, ssl.SSLError):
            return
        finally:
            sock.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    made: list[RawServer] = []

    def make(script: Script, context: ssl.SSLContext | None = None) -> RawServer:
        made.append(RawServer(script, context))
        return made[-1]

    yield make
    for server in made:
        server.close()


def _commit(nessie: SyncNessieClient) -> str:
    return nessie.commit("main", "ab" * 32, [Operation.put_namespace(("ns",))], "msg").hash


def test_sync_requests_skip_httpx_client_and_share_one_connection(
    serve: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # httpx.Client's request building, URL merging, models and cookies were ~85 % of the sync
    # client's CPU per request (docs/benchmarks.md, "2026-12-02 small hours").
    def refuse(*args: object, **kw: object) -> None:
        raise AssertionError("the sync Nessie client went through httpx.Client")

    monkeypatch.setattr(httpx.Client, "send", refuse)
    server = serve(lambda r: (_answer(200, COMMITTED if r.method == "POST" else REF), False))
    settings = Settings.from_env({}, nessie_url=server.url, nessie_token=Secret("s3cret"))
    with SyncNessieClient.from_settings(settings, retry=FAST) as nessie:
        for _ in range(5):
            assert nessie.get_reference("a/b").hash == "ab" * 32
        assert _commit(nessie) == "cd" * 32
    assert server.connections == 1 and len(server.requests) == 6
    get, commit = server.requests[0], server.requests[-1]
    assert (get.method, get.path) == ("GET", "/api/v2/trees/a%2Fb")
    assert get.headers["authorization"] == "Bearer s3cret" and get.headers["nessie-client-spec"] == "2"
    assert get.headers["host"] == f"127.0.0.1:{server.port}"
    assert (commit.path, commit.headers["content-type"]) == (
        f"/api/v2/trees/main@{'ab' * 32}/history/commit",
        "application/json",
    )
    assert json.loads(commit.body)["commitMeta"]["message"] == "msg"


def test_query_parameters_are_encoded_as_httpx_did(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda r: (_answer(200, {"logEntries": [], "hasMore": False}), False))
    with SyncNessieClient(server.url, retry=FAST) as nessie:
        list(nessie.history_entries("main", max_records=5, filter="'b' in commit.properties && x == 'y z'"))
    expected = httpx.URL(
        "http://h/api/v2/trees/main/history",
        params={"max-records": 5, "filter": "'b' in commit.properties && x == 'y z'"},
    )
    assert server.requests[0].path == expected.raw_path.decode()


def test_a_kept_connection_the_server_closed_is_not_used_for_a_commit(serve: Callable[..., RawServer]) -> None:
    # Every answer says keep-alive, then the server closes the connection anyway (an idle timeout).
    server = serve(lambda r: (_answer(200, COMMITTED if r.method == "POST" else REF), True))
    with SyncNessieClient(server.url, retry=FAST) as nessie:
        nessie.get_reference("main")
        time.sleep(0.1)  # the close reaches the client's socket
        assert _commit(nessie) == "cd" * 32
    # Sent once, on a new connection: no CommitStateUnknown from the dead one.
    assert [r.method for r in server.requests] == ["GET", "POST"] and server.connections == 2


def test_a_commit_cut_off_after_sending_is_unknown_and_never_resent(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda r: None)  # reads the request, closes without an answer
    with SyncNessieClient(server.url, retry=FAST) as nessie, pytest.raises(CommitStateUnknown, match="RemoteProtocol"):
        _commit(nessie)
    assert len(server.requests) == 1


def test_a_read_cut_off_is_retried_on_a_new_connection(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda r: None if len(server.requests) == 1 else (_answer(200, REF), False))
    with SyncNessieClient(server.url, retry=FAST) as nessie:
        assert nessie.get_reference("main").name == "main"
    assert len(server.requests) == 2 and server.connections == 2


def test_a_commit_timeout_after_sending_is_unknown_and_never_resent(serve: Callable[..., RawServer]) -> None:
    def slow(r: Request) -> tuple[bytes, bool]:
        time.sleep(0.5)
        return _answer(200, COMMITTED), False

    server = serve(slow)
    with SyncNessieClient(server.url, retry=FAST, timeout=0.1) as nessie:
        with pytest.raises(CommitStateUnknown, match="ReadTimeout"):
            _commit(nessie)
    assert len(server.requests) == 1


def test_connection_refused_is_retried_for_a_commit_and_known_not_applied() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with SyncNessieClient(f"http://127.0.0.1:{port}/api/v2", retry=FAST) as nessie:
        with pytest.raises(NessieUnavailable, match="ConnectError") as caught:
            _commit(nessie)
    assert not isinstance(caught.value, CommitStateUnknown)


def test_chunked_close_delimited_and_interim_answers_are_read(serve: Callable[..., RawServer]) -> None:
    data = json.dumps(REF).encode()
    chunked = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"".join(b"%x;ext=1\r\n%s\r\n" % (len(data[i : i + 7]), data[i : i + 7]) for i in range(0, len(data), 7))
    chunked += b"0\r\nTrailer: x\r\n\r\n"
    close_delimited = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + data
    answers = [(chunked, False), (close_delimited, True), (_answer(200, REF, extra="Connection: close\r\n"), False)]
    server = serve(lambda r: answers[len(server.requests) - 1])
    with SyncNessieClient(server.url, retry=FAST) as nessie:
        for _ in answers:
            assert nessie.get_reference("main").hash == "ab" * 32
    assert server.connections == 2  # the chunked answer kept its connection; Connection: close did not


def test_an_idle_connection_past_the_keepalive_expiry_is_replaced(
    serve: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nessie_http, "KEEPALIVE_S", 0.0)
    server = serve(lambda r: (_answer(200, REF), False))
    with SyncNessieClient(server.url, retry=FAST) as nessie:
        nessie.get_reference("main")
        nessie.get_reference("main")
    assert server.connections == 2


def test_oauth2_token_is_sent_and_refreshed_once_after_a_401(
    serve: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    issued: list[str] = []

    def token_endpoint(request: httpx.Request) -> httpx.Response:
        issued.append(f"tok-{len(issued)}")
        return httpx.Response(200, json={"access_token": issued[-1], "expires_in": 3600})

    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(token_endpoint), **kw))
    server = serve(
        lambda r: (
            (_answer(200, COMMITTED), False)
            if r.headers.get("authorization") == f"Bearer {issued[-1]}"
            else (_answer(401, {}), False)
        )
    )
    auth = NessieAuth(token_url="https://idp/token", client_id="c", client_secret=Secret("pw"))
    with SyncNessieClient(server.url, retry=FAST, auth=auth) as nessie:
        assert _commit(nessie) == "cd" * 32
        issued.append("rotated-on-the-server")  # the cached token is now refused: 401, refetch, resend
        assert _commit(nessie) == "cd" * 32
    assert auth.fetches == 2
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer tok-0", "Bearer tok-0", "Bearer tok-2"]


def _certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca, cert, key) files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(
        subject: str,
        issuer: x509.Name | None,
        key: ec.EllipticCurvePrivateKey,
        sign: ec.EllipticCurvePrivateKey,
        ca: bool,
    ) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
            builder = builder.add_extension(san, critical=False)
        return builder.sign(sign, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = build("test CA", None, ca_key, ca_key, True)
    cert = build("127.0.0.1", ca.subject, key, ca_key, False)
    paths = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def test_tls_verifies_the_server_against_the_ca_file(serve: Callable[..., RawServer], tmp_path: Path) -> None:
    ca, cert, key = _certificates(tmp_path)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    server = serve(lambda r: (_answer(200, COMMITTED), False), server_context)
    with SyncNessieClient(server.url, retry=FAST, verify=tls_context(str(ca))) as nessie:
        assert _commit(nessie) == "cd" * 32
        assert _commit(nessie) == "cd" * 32
    assert server.connections == 1
    # Without the CA the handshake fails before the request: a connect error, the commit known unapplied.
    with SyncNessieClient(server.url, retry=FAST) as nessie:
        with pytest.raises(NessieUnavailable, match="ConnectError.*CERTIFICATE_VERIFY_FAILED") as caught:
            _commit(nessie)
    assert not isinstance(caught.value, CommitStateUnknown) and len(server.requests) == 2
