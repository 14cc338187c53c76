"""Publish notifications against a real local HTTP server: the body is Slack-compatible; failures count."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from worlds.publish_notify import NOTIFY_FAILURES, notify


class _Hook(BaseHTTPRequestHandler):
    received: list[dict] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_hook() -> Iterator[tuple[str, type[_Hook]]]:
    """A webhook receiver on a free local port: ``(url, handler class with .received)``."""
    handler = type("Hook", (_Hook,), {"received": [], "status": 200})
    server = HTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", handler
    server.shutdown()


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    with serve_hook() as h:
        yield h


DETAIL = {"plan_id": "pl-1", "source": "etl", "target": "prod", "reason": "published by fast-forward", "commit": "abc"}


def test_success_posts_a_slack_body(hook) -> None:
    url, h = hook
    assert notify(url, "published", DETAIL)
    (body,) = h.received
    assert body["text"] == "causeway publish published: etl -> prod (pl-1)"
    assert body["attachments"][0]["color"] == "#2EB67D" and "commit: abc" in body["attachments"][0]["text"]


def test_a_failing_webhook_is_counted_never_raised(hook) -> None:
    url, h = hook
    h.status = 500
    before = NOTIFY_FAILURES.labels("failed")._value.get()
    assert notify(url, "failed", DETAIL) is False
    assert notify("http://127.0.0.1:1/unreachable", "failed", DETAIL) is False
    assert NOTIFY_FAILURES.labels("failed")._value.get() == before + 2
    assert len(h.received) == 1


def test_no_url_no_call() -> None:
    assert notify("", "published", DETAIL) is False
