"""The metric catalogue follows Prometheus conventions, is documented, and its helpers record what
they say."""

from __future__ import annotations

import re
import subprocess
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitoring import docs
from monitoring.dashboards import DASHBOARDS, build
from monitoring.lag_exporter import LagMetrics
from monitoring.metrics import (
    ALL_WORLDS,
    DEAD_LETTER_REASONS,
    FLUSH_WAIT_BUCKETS,
    INVALID_WORLD,
    OTHER_REASON,
    UNKNOWN_WORLD,
    Metrics,
    add_metrics_page,
    observe_many,
    reason_label,
    world_label,
)
from streams.lag import PartitionOffsets

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_LABELS = {
    "world",
    "topic",
    "partition",
    "reason",
    "outcome",
    "layer",
    "dependency",
    "object_type",
    "group",
    "check",
}  # check: the publish gate's four audit checks
# What a gauge or histogram name may end in: a base unit, or the thing it counts.
UNITS: tuple[str, ...] = ("_seconds", "_bytes", "_messages", "_events", "_rows", "_offset", "_commits")
UNITS += ("_version", "_difference", "_drift", "_up")
UNITS += ("_blocked", "_failed", "_changes")  # the publish gate's 0/1 flags (issue 16 names them)


@pytest.fixture
def m() -> Metrics:
    return Metrics()


def _busy(m: Metrics) -> Metrics:
    """Touch every metric once, so the exposition holds a sample of each."""
    m.consumed("onto.changes.objects", 5)
    m.inflight("w1", 3, 1000.0)
    m.event_outcome("w1", "applied", 3)
    m.dead_lettered("onto.changes.objects", "malformed-json", world="w1")
    m.set_parked("w1", 1)
    m.released("w1", [0.5])
    m.committed("w1", duration_s=0.1, rows=3, nbytes=4096, occurred_at=[1.0, 2.0], at=10.0)
    m.commit_retry("w1", "conflict")
    m.flush_started(0.4)
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
def test_names_follow_prometheus_conventions() -> None:
    names = [info.name for info in docs.catalog()]
    assert len(names) == len(set(names)), "a metric is defined twice"
    for info in docs.catalog():
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


def test_every_metric_has_help_text() -> None:
    for info in docs.catalog():
        assert len(info.help) >= 20 and info.help.endswith("."), f"{info.name}: help {info.help!r}"


def test_label_sets_are_small_and_bounded() -> None:
    for info in docs.catalog():
        assert len(info.labels) <= 3, f"{info.name} has {len(info.labels)} labels"
        assert set(info.labels) <= ALLOWED_LABELS, f"{info.name}: {set(info.labels) - ALLOWED_LABELS}"
        assert not any("id" in label.split("_") for label in info.labels), f"{info.name} labels by id"


def test_exposition_passes_promtool_lint(m: Metrics, promtool: str) -> None:
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
    for info in docs.catalog():
        assert f"`{info.name}`" in text, f"docs/metrics.md does not list {info.name}"
    _, alerts = docs.load_rules()
    for alert in alerts:
        assert alert in text, f"docs/metrics.md does not mention alert {alert}"


def test_docs_metric_and_alert_tables_are_current() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    assert docs.update(text) == text, "docs/metrics.md is stale: run python -m monitoring.docs"


def test_rules_and_dashboards_only_read_metrics_that_exist() -> None:
    known = {info.name for info in docs.catalog()}
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


def _rows(*rows: tuple[int, int, int, int | None, float | None]) -> list[PartitionOffsets]:
    return [PartitionOffsets("t", p, end, low, committed, ts) for p, end, low, committed, ts in rows]


def test_lag_exporter_records_lag_and_time_lag_and_drops_partitions_that_went_away() -> None:
    lm = LagMetrics()
    get = lm.registry.get_sample_value
    lm.record("g", _rows((3, 150, 0, 100, 970.0), (4, 80, 30, None, 990.0), (5, 10, 0, 10, None)), now=1000.0)
    assert get("causeway_consumer_lag_messages", {"group": "g", "topic": "t", "partition": "3"}) == 50
    assert get("causeway_consumer_lag_seconds", {"group": "g", "topic": "t", "partition": "3"}) == 30.0
    # never committed: lags from the earliest retained offset, which is also its position
    assert get("causeway_consumer_lag_messages", {"group": "g", "topic": "t", "partition": "4"}) == 50
    assert get("causeway_partition_committed_offset", {"group": "g", "topic": "t", "partition": "4"}) == 30
    assert get("causeway_consumer_lag_seconds", {"group": "g", "topic": "t", "partition": "5"}) == 0  # caught up
    lm.record("g", _rows((4, 80, 30, 80, None)), now=1001.0)
    assert get("causeway_consumer_lag_messages", {"group": "g", "topic": "t", "partition": "3"}) is None
    assert get("causeway_consumer_lag_seconds", {"group": "g", "topic": "t", "partition": "4"}) == 0
    lm.record("other", _rows((4, 80, 30, 0, 900.0)), now=1001.0)  # another group keeps its own series
    assert get("causeway_consumer_lag_messages", {"group": "g", "topic": "t", "partition": "4"}) == 0
    assert get("causeway_consumer_lag_messages", {"group": "other", "topic": "t", "partition": "4"}) == 80


def test_lag_exporter_marks_success_and_failure() -> None:
    lm = LagMetrics()
    get = lm.registry.get_sample_value
    assert get("causeway_lag_exporter_polls_total", {"outcome": "failed"}) == 0  # created at 0
    lm.failed()
    assert get("causeway_dependency_up", {"dependency": "kafka"}) == 0
    lm.succeeded(1234.0)
    assert get("causeway_lag_exporter_last_success_timestamp_seconds") == 1234.0
    assert get("causeway_dependency_up", {"dependency": "kafka"}) == 1
    assert get("causeway_lag_exporter_polls_total", {"outcome": "ok"}) == 1


def test_lag_exporter_exposition_passes_promtool_lint(promtool: str) -> None:
    lm = LagMetrics()
    lm.record("g", _rows((0, 10, 0, 4, 1.0)), now=2.0)
    lm.succeeded(2.0)
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=generate_latest(lm.registry).decode(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dead_letter_series_start_at_zero_for_every_known_reason(m: Metrics) -> None:
    get = m.registry.get_sample_value
    m.dead_letter_series(["objects", "links"])
    for reason in DEAD_LETTER_REASONS:
        assert get("causeway_dead_letters_total", {"topic": "links", "reason": reason}) == 0
    m.dead_lettered("links", "malformed-json")
    assert get("causeway_dead_letters_total", {"topic": "links", "reason": "malformed-json"}) == 1


def test_dead_letter_reason_list_names_every_reason_the_change_path_uses() -> None:
    # Reason codes are string literals at the places that reject: models.events (Invalid / _Reject),
    # the causal gate, the dedupe version rule and the applier. A new one must be created at 0 too.
    found = set()
    for path, pattern in (
        ("models/events.py", r'(?:Invalid|_Reject)\("([a-z0-9-]+)"'),
        ("agents/causal.py", r'^[A-Z_]+ = "([a-z0-9]+-[a-z0-9-]+)"'),
        ("agents/dedupe.py", r'^[A-Z_]+ = "([a-z0-9]+-[a-z0-9-]+)"'),
        ("agents/applier.py", r'^[A-Z_]+ = "([a-z0-9]+-[a-z0-9-]+)"'),
    ):
        found |= set(re.findall(pattern, (ROOT / path).read_text(), re.MULTILINE))
    assert found, "no reason codes found: the patterns above are out of date"
    assert found <= set(DEAD_LETTER_REASONS), (
        f"missing from DEAD_LETTER_REASONS: {sorted(found - set(DEAD_LETTER_REASONS))}"
    )


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


def test_metrics_page_serves_our_registry_without_faust_sensors(m: Metrics) -> None:
    # Faust's sensors break naming conventions that promtool flags; the worker serves ours only.
    faust = pytest.importorskip("faust")
    app = faust.App("causeway-metrics-test", broker="kafka://127.0.0.1:1")  # never started
    add_metrics_page(app, m)
    assert type(app.monitor).__name__ != "PrometheusMonitor"
    names = {f.name for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    assert names and all(n.startswith("causeway_") for n in names)


def _every_series_of(m: Metrics, world: str) -> None:
    """Every helper, every outcome, for one world: the most series a served world can have."""
    from monitoring.metrics import LAYERS, MERGE_OUTCOMES, RECONCILE_OUTCOMES, RETRY_REASONS, SCHEMA_OUTCOMES

    m.inflight(world, 1, 1.0)
    for outcome in ("applied", "duplicate", "parked", "released"):
        m.event_outcome(world, outcome)
    for reason in DEAD_LETTER_REASONS:
        m.dead_lettered("objects", reason, world=world)
    m.set_parked(world, 1)
    m.released(world, [1.0])
    m.committed(world, duration_s=1, rows=1, nbytes=1, occurred_at=[1.0])
    m.committed(world, duration_s=1, rows=1, nbytes=1, outcome="already_committed")
    m.commit_failed(world, duration_s=1, retries_exhausted=True)
    m.commit_failed(world, duration_s=1, retries_exhausted=False)
    for reason in RETRY_REASONS:
        m.commit_retry(world, reason)
    m.idempotency(world, lookups=1, duplicates=1)
    m.schema_versions(world, dict.fromkeys(LAYERS, 1))
    for outcome in SCHEMA_OUTCOMES:
        m.schema_change(world, outcome, reason="narrowing", lag_s=1.0)
    for outcome in RECONCILE_OUTCOMES:
        m.reconciled(world, outcome, duration_s=1.0, drift={"Person": 1, "Org": 2})
    for outcome in MERGE_OUTCOMES:
        m.merged(world, outcome, conflicts=1)


def _series(m: Metrics) -> int:
    return sum(1 for line in generate_latest(m.registry).decode().splitlines() if line and not line.startswith("#"))


@pytest.mark.parametrize("worlds", [0, 1, 3, 10])
def test_series_stay_under_the_documented_bound(worlds: int) -> None:
    from prometheus_client import disable_created_metrics

    from monitoring.metrics import DEPENDENCIES, series_bound

    disable_created_metrics()  # as the worker's /metrics page does (add_metrics_page), not only after that test
    m = Metrics()
    m.dead_letter_series(["objects", "links"])
    m.consumed("objects")
    m.consumed("links")
    for dep in DEPENDENCIES:
        m.dependency(dep, True)
    for i in range(worlds):
        _every_series_of(m, f"w{i}")
    assert _series(m) <= series_bound(worlds, topics=2, object_types=2)
    assert "series_bound" in (ROOT / "docs" / "metrics.md").read_text()


@given(
    st.lists(st.lists(st.one_of(st.sampled_from([0.0, 0.005, 0.1, 1.0, 2.5, 10.0]), st.floats(0, 1e6)), max_size=30))
)
def test_observe_many_counts_as_observing_one_value_at_a_time(batches: list[list[float]]) -> None:
    """Bucket boundaries included (a value equal to a bound falls in that bound's bucket)."""
    one, many = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("h", "h", ["w"], registry=one, buckets=(0.005, 0.1, 1.0, 2.5, 10.0))
    h2 = Histogram("h", "h", ["w"], registry=many, buckets=(0.005, 0.1, 1.0, 2.5, 10.0))
    for values in batches:
        child = h1.labels("a")  # the series exists once asked for, observed or not (as committed() does)
        for v in values:
            child.observe(v)
        observe_many(h2.labels("a"), values)
    samples = lambda reg: {  # noqa: E731
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in reg.collect()
        for s in fam.samples
        if not s.name.endswith("_created")
    }
    got, want = samples(many), samples(one)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key


def _poll_flush_and_tick(m: Metrics, world: str, count: int) -> None:
    """What the applier records per poll, per flush and per tick for one world."""
    m.consumed("onto.changes.objects", 5)
    m.idempotency(world, lookups=5, duplicates=1)
    m.event_outcome(world, "duplicate", 1)
    m.released(world, [0.1])
    m.dependency("redis", True)
    m.committed(world, duration_s=0.2, rows=4, nbytes=100, occurred_at=[1.0] * 4, at=10.0)
    m.event_outcome(world, "applied", 4)
    m.set_parked(world, 0)
    m.inflight(world, count, 5.0 if count else None)


def test_the_hot_path_looks_a_series_up_once(m: Metrics, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per poll, flush and tick the helpers reuse the series they created: ``labels()`` converts,
    checks and locks on every call, a few thousand calls a second at 100 worlds."""
    from prometheus_client.metrics import MetricWrapperBase

    _poll_flush_and_tick(m, "w1", 0)
    real, calls = MetricWrapperBase.labels, []

    def counting(self: Any, *values: Any, **kw: Any) -> Any:
        calls.append(values)
        return real(self, *values, **kw)

    monkeypatch.setattr(MetricWrapperBase, "labels", counting)
    _poll_flush_and_tick(m, "w1", 0)
    assert calls == []
    # The series still move: the counts add up, and the oldest-in-flight series comes and goes.
    get = m.registry.get_sample_value
    assert get("causeway_events_total", {"world": "w1", "outcome": "applied", "reason": ""}) == 8
    assert get("causeway_idempotency_lookups_total", {"world": "w1"}) == 10
    assert get("causeway_commits_total", {"world": "w1", "outcome": "committed"}) == 2
    _poll_flush_and_tick(m, "w1", 3)
    assert get("causeway_inflight_oldest_timestamp_seconds", {"world": "w1"}) == 5.0
    _poll_flush_and_tick(m, "w1", 0)
    assert get("causeway_inflight_oldest_timestamp_seconds", {"world": "w1"}) is None
    assert get("causeway_inflight_events", {"world": "w1"}) == 0


def test_a_flush_wait_between_one_and_thirty_seconds_lies_in_a_bucket_at_most_half_again_its_lower_bound() -> None:
    # With 100 worlds a round of commits is 3-20 s; a 5-10 s bucket made one round read as two.
    bounds = [b for b in FLUSH_WAIT_BUCKETS if 1 <= b <= 30]
    assert bounds[0] == 1 and bounds[-1] == 30
    assert all(hi / lo <= 1.5 for lo, hi in pairwise(bounds))


def test_flush_wait_histogram_uses_its_own_bounds(m: Metrics) -> None:
    m.flush_wait.observe(5.4)
    text = generate_latest(m.registry).decode()
    counts = {
        s.labels["le"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "causeway_flush_wait_seconds"
        for s in f.samples
        if s.name.endswith("_bucket")
    }
    assert counts["5.0"] == 0 and counts["6.0"] == 1
