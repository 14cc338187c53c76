"""Retry, unknown-outcome and error mapping of the Nessie client, against a scripted local HTTP stub."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sinks.errors import (
    CommitStateUnknown,
    NessieAuthError,
    NessieConflict,
    NessieUnavailable,
    error_from_response,
)
from sinks.nessie import NessieClient, Operation, RetryPolicy, SyncNessieClient
from streams.settings import Secret, Settings

FAST = RetryPolicy(attempts=4, base_s=0.001, cap_s=0.01)
REF = {"reference": {"type": "BRANCH", "name": "main", "hash": "ab" * 32}}
COMMITTED = {"targetBranch": {"type": "BRANCH", "name": "main", "hash": "cd" * 32}, "addedContents": None}
# The 409 body Nessie 0.99 sends with Nessie-Client-Spec: 2 (measured).
CONFLICT = {
    "status": 409,
    "reason": "Conflict",
    "message": "Values of existing and expected content for key 'ns.t1' are different.",
    "errorCode": "REFERENCE_CONFLICT",
    "errorDetails": {
        "type": "REFERENCE_CONFLICTS",
        "conflicts": [
            {
                "conflictType": "VALUE_DIFFERS",
                "key": {"elements": ["ns", "t1"]},
                "message": "values of existing and expected content for key 'ns.t1' are different",
            }
        ],
    },
    "serverStackTrace": None,
}


Script = list[tuple[int, object, float]]


class Stub:
    """Answers requests from a script of (status, body, delay_s); the last answer repeats."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                stub.requests.append((self.command, self.path, dict(self.headers)))
                status, body, delay = stub.script[min(len(stub.requests), len(stub.script)) - 1]
                time.sleep(delay)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up waiting

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/api/v2"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[Callable[[Script], Stub]]:
    """A factory of started stubs, all shut down after the test."""
    made: list[Stub] = []

    def make(script: Script) -> Stub:
        made.append(Stub(script))
        return made[-1]

    yield make
    for server in made:
        server.close()


def _commit_args() -> tuple:
    return ("main", "ab" * 32, [Operation.put_namespace(("ns",))], "msg")


async def test_read_retries_503_twice_then_succeeds(stub: Callable[[Script], Stub]) -> None:
    server = stub([(503, {"message": "busy"}, 0), (503, {}, 0), (200, REF, 0)])
    async with NessieClient(server.url, retry=FAST) as nessie:
        ref = await nessie.get_reference("main")
    assert ref.hash == "ab" * 32 and len(server.requests) == 3


def test_sync_facade_retries_the_same_way(stub: Callable[[Script], Stub]) -> None:
    server = stub([(503, {}, 0), (503, {}, 0), (200, REF, 0)])
    with SyncNessieClient(server.url, retry=FAST) as nessie:
        assert nessie.get_reference("main").name == "main"
    assert len(server.requests) == 3


async def test_read_gives_up_after_the_last_attempt(stub: Callable[[Script], Stub]) -> None:
    server = stub([(503, {"message": "down", "errorCode": "UNKNOWN"}, 0)])
    async with NessieClient(server.url, retry=FAST) as nessie:
        with pytest.raises(NessieUnavailable) as caught:
            await nessie.get_reference("main")
    assert not isinstance(caught.value, CommitStateUnknown)
    assert caught.value.status == 503 and len(server.requests) == FAST.attempts


async def test_other_5xx_on_a_read_is_not_retried(stub: Callable[[Script], Stub]) -> None:
    server = stub([(500, {"message": "boom"}, 0), (200, REF, 0)])
    async with NessieClient(server.url, retry=FAST) as nessie:
        with pytest.raises(NessieUnavailable):
            await nessie.get_reference("main")
    assert len(server.requests) == 1


async def test_commit_on_503_is_unknown_and_never_resent(stub: Callable[[Script], Stub]) -> None:
    server = stub([(503, {}, 0), (200, COMMITTED, 0)])
    async with NessieClient(server.url, retry=FAST) as nessie:
        with pytest.raises(CommitStateUnknown):
            await nessie.commit(*_commit_args())
    assert len(server.requests) == 1


async def test_commit_timeout_after_sending_is_unknown_and_never_resent(
    stub: Callable[[Script], Stub],
) -> None:
    server = stub([(200, COMMITTED, 0.5)])
    async with NessieClient(server.url, retry=FAST, timeout=0.1) as nessie:
        with pytest.raises(CommitStateUnknown):
            await nessie.commit(*_commit_args())
    assert len(server.requests) == 1


async def test_read_timeout_is_retried(stub: Callable[[Script], Stub]) -> None:
    server = stub([(200, REF, 0.5), (200, REF, 0)])
    async with NessieClient(server.url, retry=FAST, timeout=0.1) as nessie:
        assert (await nessie.get_reference("main")).name == "main"
    assert len(server.requests) == 2


async def test_commit_is_retried_on_429_because_nothing_was_applied(stub: Callable[[Script], Stub]) -> None:
    server = stub([(429, {"message": "slow down"}, 0), (200, COMMITTED, 0)])
    async with NessieClient(server.url, retry=FAST) as nessie:
        result = await nessie.commit(*_commit_args())
    assert result.hash == "cd" * 32 and len(server.requests) == 2


async def test_merge_dry_run_is_a_read_and_is_retried(stub: Callable[[Script], Stub]) -> None:
    merged = {"wasApplied": False, "wasSuccessful": True, "details": []}
    server = stub([(503, {}, 0), (200, merged, 0)])
    async with NessieClient(server.url, retry=FAST) as nessie:
        result = await nessie.merge("main", "ab" * 32, "dev", "cd" * 32, dry_run=True)
    assert result.was_successful and len(server.requests) == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_connection_refused_is_retried_even_for_a_commit(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/api/v2"
    caplog.set_level(logging.WARNING, logger="sinks.nessie")
    async with NessieClient(url, retry=FAST) as nessie:
        with pytest.raises(NessieUnavailable) as caught:
            await nessie.commit(*_commit_args())
    # Nothing was sent, so the outcome is known: not applied.
    assert not isinstance(caught.value, CommitStateUnknown)
    assert "ConnectError" in str(caught.value)
    assert len([r for r in caplog.records if "retry" in r.getMessage()]) == FAST.attempts - 1


async def test_headers_token_and_conflict_parsing(stub: Callable[[Script], Stub]) -> None:
    server = stub([(409, CONFLICT, 0)])
    settings = Settings.from_env({}, nessie_url=server.url, nessie_token=Secret("s3cret"))
    async with NessieClient.from_settings(settings, retry=FAST) as nessie:
        assert "s3cret" not in repr(nessie)
        with pytest.raises(NessieConflict) as caught:
            await nessie.commit(*_commit_args())
    [(method, path, headers)] = server.requests
    assert (method, path) == ("POST", f"/api/v2/trees/main@{'ab' * 32}/history/commit")
    assert headers["Authorization"] == "Bearer s3cret" and headers["Nessie-Client-Spec"] == "2"
    [conflict] = caught.value.conflicts
    assert (conflict.conflict_type, conflict.key) == ("VALUE_DIFFERS", ("ns", "t1"))


def test_status_mapping() -> None:
    assert isinstance(error_from_response(401, b""), NessieAuthError)
    assert isinstance(error_from_response(403, b"not json"), NessieAuthError)
    assert type(error_from_response(502, b"")) is NessieUnavailable
    assert type(error_from_response(502, b"", outcome_unknown=True)) is CommitStateUnknown
    # 429 is a refusal before any work: known outcome even for a commit.
    assert type(error_from_response(429, b"", outcome_unknown=True)) is NessieUnavailable
    assert error_from_response(409, b'{"errorCode": "REFERENCE_CONFLICT"}').conflicts == ()  # type: ignore[attr-defined]
