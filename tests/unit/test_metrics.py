"""The metric catalogue follows Prometheus conventions, is documented, and its helpers record what
they say."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitoring import docs
from monitoring.dashboards import DASHBOARDS, build
from monitoring.lag import PartitionOffsets
from monitoring.metrics import (
    ALL_WORLDS,
    INVALID_WORLD,
    OTHER_REASON,
    UNKNOWN_WORLD,
    Metrics,
    reason_label,
    register_faust_sensors,
    world_label,
)

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_LABELS = {"world", "topic", "partition", "reason", "outcome", "layer", "dependency", "object_type"}
# What a gauge or histogram name may end in: a base unit, or the thing it counts.
UNITS: tuple[str, ...] = ("_seconds", "_bytes", "_messages", "_events", "_rows", "_offset")
UNITS += ("_version", "_difference", "_drift", "_up")


@pytest.fixture
def m() -> Metrics:
    return Metrics()


def _busy(m: Metrics) -> Metrics:
    """Touch every metric once, so the exposition holds a sample of each."""
    m.partition_offsets("onto.changes.objects", 0, 100, 40)
    m.consumed("onto.changes.objects", 5)
    m.inflight("w1", 3, 1000.0)
    m.event_outcome("w1", "applied", 3)
    m.dead_lettered("onto.changes.objects", "malformed-json", world="w1")
    m.set_parked("w1", 1)
    m.released("w1", [0.5])
    m.committed("w1", duration_s=0.1, rows=3, nbytes=4096, occurred_at=[1.0, 2.0], at=10.0)
    m.commit_retry("w1", "conflict")
    m.commit_failed("w1", duration_s=2.0, retries_exhausted=True)
    m.idempotency("w1", lookups=10, duplicates=1)
    m.schema_versions("w1", {"control": 3, "data": 2, "intelligence": 2})
    m.schema_change("w1", "refused", reason="narrowing", lag_s=0.3)
    m.reconciled("w1", "repaired", duration_s=1.5, drift={"person": -3}, repairs=1, at=20.0)
    m.merged("w1", "conflict", conflicts=2)
    m.dependency("redis", True)
    m.cdc_batch(skipped={"heartbeat": 2}, events=5, failures={"event-too-large": 1}, committed_at=30.0)
    m.cdc_waiting_records(7)
    return m


# --------------------------------------------------------------------------------------- conventions
def test_names_follow_prometheus_conventions(m: Metrics) -> None:
    names = [info.name for info in m.catalog]
    assert len(names) == len(set(names)), "a metric is defined twice"
    for info in m.catalog:
        assert re.fullmatch(r"causeway_[a-z][a-z0-9_]*[a-z0-9]", info.name), info.name
        assert not re.search(r"_(bucket|sum|count|created|total_total)$", info.name), info.name
        if info.type == "counter":
            assert info.name.endswith("_total"), f"counter {info.name} must end in _total"
        else:
            assert not info.name.endswith("_total"), f"{info.type} {info.name} must not end in _total"
            assert info.name.endswith(UNITS), f"{info.name} names no unit"
        if re.search(r"_(duration|latency|wait|age)(_|$)", info.name):
            assert info.name.endswith("_seconds"), f"{info.name} is a time and must be in _seconds"
        if "timestamp" in info.name:
            assert info.name.endswith("_timestamp_seconds"), info.name


def test_every_metric_has_help_text(m: Metrics) -> None:
    for info in m.catalog:
        assert len(info.help) >= 20 and info.help.endswith("."), f"{info.name}: help {info.help!r}"


def test_label_sets_are_small_and_bounded(m: Metrics) -> None:
    for info in m.catalog:
        assert len(info.labels) <= 3, f"{info.name} has {len(info.labels)} labels"
        assert set(info.labels) <= ALLOWED_LABELS, f"{info.name}: {set(info.labels) - ALLOWED_LABELS}"
        assert not any("id" in label.split("_") for label in info.labels), f"{info.name} labels by id"


def test_exposition_passes_promtool_lint(m: Metrics) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed; scripts/services.sh fetch installs it", pytrace=False)
    text = generate_latest(_busy(m).registry).decode()
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_exposition_has_every_catalogued_metric(m: Metrics) -> None:
    exposition = generate_latest(_busy(m).registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(exposition)}
    for info in m.catalog:
        base = info.name.removesuffix("_total") if info.type == "counter" else info.name
        assert base in families, f"{info.name} missing from /metrics"
        assert families[base].type == info.type


# --------------------------------------------------------------------------------------- docs
def test_docs_list_every_metric_and_alert() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    for info in Metrics().catalog:
        assert f"`{info.name}`" in text, f"docs/metrics.md does not list {info.name}"
    _, alerts = docs.load_rules()
    for alert in alerts:
        assert alert in text, f"docs/metrics.md does not mention alert {alert}"


def test_docs_metric_and_alert_tables_are_current() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    assert docs.update(text) == text, "docs/metrics.md is stale: run python -m monitoring.docs"


def test_rules_and_dashboards_only_read_metrics_that_exist() -> None:
    known = {info.name for info in Metrics().catalog}
    recorded, alerts = docs.load_rules()
    used = set()
    for expr in [*recorded.values(), *alerts.values()]:
        used |= docs.metric_names(expr)
    for uid in DASHBOARDS:
        for panel in build(uid)["panels"]:
            for target in panel["targets"]:
                used |= docs.metric_names(target["expr"])
    histogram_series = {n for n in used if re.search(r"_(bucket|sum|count)$", n)}
    assert used - histogram_series <= known, f"unknown metrics: {sorted(used - histogram_series - known)}"
    assert not {n for n in used if n.startswith("causeway:")} - set(recorded), "unknown recording rule"


# --------------------------------------------------------------------------------------- helpers
def test_label_values_are_sanitised() -> None:
    assert world_label("prod") == "prod"
    assert world_label(None) == world_label("") == UNKNOWN_WORLD
    assert world_label("Bad World!") == world_label("a" * 64) == world_label("x@y") == INVALID_WORLD
    assert reason_label("malformed-json") == "malformed-json"
    for bad in ("Some free text: id=123", None, "x" * 60):
        assert reason_label(bad) == OTHER_REASON


def test_partition_offsets_compute_lag_and_forget_removes(m: Metrics) -> None:
    get = m.registry.get_sample_value
    assert m.partition_offsets("t", 3, end_offset=150, committed_offset=100) == 50
    assert get("causeway_consumer_lag_messages", {"topic": "t", "partition": "3"}) == 50
    assert m.partition_offsets("t", 4, end_offset=80, committed_offset=None, low_offset=30) == 50
    assert get("causeway_partition_committed_offset", {"topic": "t", "partition": "4"}) == 30
    assert m.partition_offsets("t", 5, end_offset=10, committed_offset=12) == 0  # never negative
    m.forget_partition("t", 3)
    m.forget_partition("t", 3)  # twice is harmless
    assert get("causeway_consumer_lag_messages", {"topic": "t", "partition": "3"}) is None
    assert get("causeway_partition_end_offset", {"topic": "t", "partition": "3"}) is None


def test_inflight_oldest_timestamp_disappears_when_nothing_is_in_flight(m: Metrics) -> None:
    get = m.registry.get_sample_value
    m.inflight("w1", 2, 1234.0)
    assert get("causeway_inflight_oldest_timestamp_seconds", {"world": "w1"}) == 1234.0
    m.inflight("w1", 0, None)
    assert get("causeway_inflight_oldest_timestamp_seconds", {"world": "w1"}) is None
    assert get("causeway_inflight_events", {"world": "w1"}) == 0


def test_inflight_per_worker_scope_creates_no_world_series(m: Metrics) -> None:
    # The applier reports in-flight events per process as world "all": that must not appear as a
    # world with (zero) commit and outcome series, or the dashboards' world list would show it.
    get = m.registry.get_sample_value
    m.inflight(ALL_WORLDS, 4, 99.0)
    assert get("causeway_inflight_events", {"world": ALL_WORLDS}) == 4
    assert get("causeway_commits_total", {"world": ALL_WORLDS, "outcome": "committed"}) is None
    assert get("causeway_events_total", {"world": ALL_WORLDS, "outcome": "applied", "reason": ""}) is None


def test_partition_offsets_lag_counts_from_the_earliest_offset_when_never_committed() -> None:
    assert PartitionOffsets("t", 0, end=120, low=20, committed=None).lag == 100
    assert PartitionOffsets("t", 0, end=120, low=20, committed=-1).lag == 100
    assert PartitionOffsets("t", 0, end=120, low=20, committed=115).lag == 5
    assert PartitionOffsets("t", 0, end=120, low=20, committed=120).lag == 0


def test_first_sight_of_a_world_creates_its_outcome_series_at_zero(m: Metrics) -> None:
    get = m.registry.get_sample_value
    m.set_parked("w2", 0)
    assert get("causeway_commits_total", {"world": "w2", "outcome": "committed"}) == 0
    assert get("causeway_commit_retries_exhausted_total", {"world": "w2"}) == 0
    assert get("causeway_events_total", {"world": "w2", "outcome": "applied", "reason": ""}) == 0
    assert get("causeway_idempotency_lookups_total", {"world": "w2"}) == 0
    # A pseudo-world (no readable or valid id) gets no commit series: it would pollute the world list.
    m.dead_lettered("t", "bad-world-id", world="NOT VALID")
    assert get("causeway_commits_total", {"world": INVALID_WORLD, "outcome": "committed"}) is None


def test_committed_records_outcome_freshness_latency_and_batch(m: Metrics) -> None:
    get = m.registry.get_sample_value
    m.committed("w1", duration_s=0.2, rows=2, nbytes=2048, occurred_at=[99.0, 101.0], at=100.0)
    assert get("causeway_commits_total", {"world": "w1", "outcome": "committed"}) == 1
    assert get("causeway_world_last_commit_timestamp_seconds", {"world": "w1"}) == 100.0
    assert get("causeway_e2e_latency_seconds_count", {"world": "w1"}) == 2
    assert get("causeway_e2e_latency_seconds_sum", {"world": "w1"}) == 1.0  # 1 s + 0 s (clock skew clamped)
    assert get("causeway_batch_rows_sum") == 2 and get("causeway_batch_bytes_sum") == 2048
    assert get("causeway_commit_duration_seconds_count", {"world": "w1"}) == 1


def test_retries_conflicts_and_exhaustion(m: Metrics) -> None:
    get = m.registry.get_sample_value
    m.commit_retry("w1", "conflict")
    m.commit_retry("w1", "unknown_state")
    m.commit_failed("w1", duration_s=3.0, retries_exhausted=True)
    assert get("causeway_occ_conflicts_total", {"world": "w1"}) == 1
    assert get("causeway_commit_retries_total", {"world": "w1", "reason": "unknown_state"}) == 1
    assert get("causeway_commit_retries_exhausted_total", {"world": "w1"}) == 1
    assert get("causeway_commits_total", {"world": "w1", "outcome": "retries_exhausted"}) == 1


def test_dead_letters_count_by_topic_and_as_event_outcome(m: Metrics) -> None:
    get = m.registry.get_sample_value
    m.dead_lettered("cdc.raw.crm.person", "bad-world-id", world="NOT A WORLD")
    dlq = {"topic": "cdc.raw.crm.person", "reason": "bad-world-id"}
    assert get("causeway_dead_letters_total", dlq) == 1
    labels = {"world": INVALID_WORLD, "outcome": "dead_lettered", "reason": "bad-world-id"}
    assert get("causeway_events_total", labels) == 1
    m.event_outcome("w1", "applied", 5, reason="ignored-for-applied")
    assert get("causeway_events_total", {"world": "w1", "outcome": "applied", "reason": ""}) == 5


def test_version_vector_difference(m: Metrics) -> None:
    assert m.schema_versions("w1", {"control": 9, "data": 3, "intelligence": 4}) == 6
    assert m.registry.get_sample_value("causeway_version_vector_difference", {"world": "w1"}) == 6
    assert m.registry.get_sample_value("causeway_schema_version", {"world": "w1", "layer": "data"}) == 3


def test_reconciliation_and_merge_helpers(m: Metrics) -> None:
    get = m.registry.get_sample_value
    m.reconciled("w1", "repaired", duration_s=2.0, drift={"person": -7, "org": 0}, repairs=1, at=50.0)
    assert get("causeway_reconciliation_drift", {"world": "w1", "object_type": "person"}) == 7
    assert get("causeway_reconciliation_repairs_total", {"world": "w1"}) == 1
    assert get("causeway_reconciliation_last_run_timestamp_seconds", {"world": "w1"}) == 50.0
    m.merged("w1", "conflict", conflicts=4)
    assert get("causeway_merges_total", {"world": "w1", "outcome": "conflict"}) == 1
    assert get("causeway_merge_conflicts_total", {"world": "w1"}) == 4


def test_unknown_enum_values_are_refused(m: Metrics) -> None:
    with pytest.raises(ValueError, match="event outcome"):
        m.event_outcome("w1", "aplied")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dependency"):
        m.dependency("postgres", True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layer"):
        m.schema_versions("w1", {"storage": 1})  # type: ignore[dict-item]


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.consumed("t", 3)
    assert b.registry.get_sample_value("causeway_events_consumed_total", {"topic": "t"}) is None


def test_faust_sensors_register_beside_ours_under_their_own_prefix(m: Metrics) -> None:
    faust = pytest.importorskip("faust")
    app = faust.App("causeway-metrics-test", broker="kafka://127.0.0.1:1")  # never started
    register_faust_sensors(app, m)
    names = {f.name for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    faust_names = {n for n in names if n.startswith("faust_")}
    assert "faust_topic_partition_end_offset" in faust_names
    assert {n for n in names - faust_names if not n.startswith("causeway_")} == set()
    assert type(app.monitor).__name__ == "PrometheusMonitor"
