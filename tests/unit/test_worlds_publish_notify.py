"""Publish notifications against a real local HTTP server: the body is Slack-compatible; failures count."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.webhooks import Hook, serve_hook
from worlds.publish_notify import NOTIFY_FAILURES, notify


@pytest.fixture
def hook() -> Iterator[tuple[str, type[Hook]]]:
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
