"""The Write-Audit-Publish gate's gauges, set by the drift-audit timer (``worlds.publish_timer``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge


class PublishGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.drift = Gauge(
            "causeway_world_drift_commits",
            "Commits the prod world is ahead of the world's merge base (last drift audit).",
            ["world"],
            registry=registry,
        )
        self.staleness = Gauge(
            "causeway_world_staleness_seconds",
            "Seconds since the world's branch last changed.",
            ["world"],
            registry=registry,
        )
        self.blocked = Gauge(
            "causeway_publish_blocked",
            "1 when the world's last audit is blocked by this check (drift, tables, entities, conflicts).",
            ["world", "check"],
            registry=registry,
        )
        self.failed = Gauge(
            "causeway_publish_failed",
            "1 when the last publish run of the world's last plan failed.",
            ["world"],
            registry=registry,
        )
        self.pending = Gauge(
            "causeway_publish_unpublished_changes",
            "1 when the world's last audit found changes not published yet (eligible or blocked).",
            ["world"],
            registry=registry,
        )

    def set(self, world: str, values: Mapping[str, Any], unpublished: bool) -> None:
        self.drift.labels(world).set(values["drift"])
        self.staleness.labels(world).set(values["staleness"])
        for check, v in values["blocked"].items():
            self.blocked.labels(world, check).set(v)
        self.failed.labels(world).set(values["failed"])
        self.pending.labels(world).set(int(unpublished))
