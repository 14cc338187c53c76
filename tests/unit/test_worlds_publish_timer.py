"""The drift audit timer's pure parts: which worlds are due, and the series they export."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from monitoring.publish_metrics import PublishGauges
from worlds.publish import BranchState, Heads, Observed, Thresholds, audit
from worlds.publish_timer import WorldHead, due, gauge_values

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
DAY = 86_400.0


def _state(verdict: str, outcome: str | None) -> BranchState:
    return BranchState("w", "prod", "pl-1", verdict, (), NOW, NOW, NOW, 0, outcome)


def test_due_worlds_are_pending_or_old() -> None:
    heads = [
        WorldHead("fresh", NOW - timedelta(hours=1)),
        WorldHead("old", NOW - timedelta(days=2)),
        WorldHead("pending", NOW - timedelta(minutes=5)),
        WorldHead("published", NOW - timedelta(minutes=5)),
        WorldHead("empty", None),
    ]
    states = {"pending": _state("eligible", None), "published": _state("eligible", "published")}
    assert due(heads, states, NOW, DAY) == ["old", "pending"]


def test_gauge_values_and_series() -> None:
    heads = Heads("etl", "prod", "s" * 64, "t" * 64, "b" * 64)
    rec = audit(heads, Observed(drift=12, tables_added=("a",)), Thresholds(max_drift=10), "timer", NOW)
    vals = gauge_values(rec, NOW - timedelta(hours=2), _state("blocked", "failed"), NOW)
    assert vals == {
        "drift": 12,
        "staleness": 7200.0,
        "blocked": {"drift": 1, "tables": 0, "entities": 0, "conflicts": 0},
        "failed": 1,
    }
    reg = CollectorRegistry()
    PublishGauges(reg).set("etl", vals, unpublished=True)
    assert reg.get_sample_value("causeway_world_drift_commits", {"world": "etl"}) == 12
    assert reg.get_sample_value("causeway_world_staleness_seconds", {"world": "etl"}) == 7200
    assert reg.get_sample_value("causeway_publish_blocked", {"world": "etl", "check": "drift"}) == 1
    assert reg.get_sample_value("causeway_publish_blocked", {"world": "etl", "check": "tables"}) == 0
    assert reg.get_sample_value("causeway_publish_failed", {"world": "etl"}) == 1
