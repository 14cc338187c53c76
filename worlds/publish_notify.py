"""Publish notifications: a Slack-compatible webhook called on success, decline, block and failure.

A notification never fails a publish: an error is logged (without the URL, which is a secret) and
counted in ``causeway_publish_notify_failures_total``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
from prometheus_client import Counter

log = logging.getLogger(__name__)

NOTIFY_FAILURES = Counter(
    "causeway_publish_notify_failures_total", "Publish notifications the webhook did not accept.", ["event"]
)
COLORS = {"published": "#2EB67D", "declined": "#ECB22E", "blocked": "#ECB22E", "refused": "#ECB22E"}


def message(event: str, detail: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body (pure): Slack's ``text`` plus one attachment with the plan's facts."""
    src, dst, pid = detail.get("source", "?"), detail.get("target", "?"), detail.get("plan_id", "?")
    title = f"causeway publish {event}: {src} -> {dst} ({pid})"
    facts = " | ".join(f"{k}: {detail[k]}" for k in ("reason", "commit", "path", "tables_modified") if detail.get(k))
    return {
        "text": title,
        "attachments": [{"color": COLORS.get(event, "danger"), "title": title, "text": facts or event}],
    }


def notify(url: str, event: str, detail: Mapping[str, Any], *, timeout: float = 5.0) -> bool:
    """POST the message; True when the webhook answered 2xx. Never raises."""
    if not url:
        return False
    try:
        resp = httpx.post(url, json=message(event, detail), timeout=timeout)
        resp.raise_for_status()
        return True
    except Exception as exc:  # any failure: log and count, the publish goes on
        NOTIFY_FAILURES.labels(event).inc()
        log.warning("publish notification %s for %s failed: %s", event, detail.get("plan_id"), type(exc).__name__)
        return False
