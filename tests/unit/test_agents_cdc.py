"""CDC ingest without a broker: settings, size limits, counters, status and the entry points' errors."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner
from prometheus_client import generate_latest

from agents.cdc import CdcIngest
from cdc.mapping import MappingError, parse_mapping
from cdc.plan import (
    TOO_LARGE,
    IngestStats,
    IngestStatus,
    counters_line,
    limit_warnings,
    plan_batch,
)
from models.deadletter import H_DETAIL, H_REASON, DeadLetter
from monitoring.metrics import Metrics
from streams.settings import Settings
from streams.topics import BROKER_DEFAULT_MESSAGE_BYTES, MESSAGE_HEADROOM_BYTES, message_bytes_needed
from tests.debezium_records import MAPPING, SETTINGS, TOPIC, Rec, good, j, payload

ROOT = Path(__file__).resolve().parents[2]
INLINE = orjson.dumps({"tables": [{"topic": TOPIC, "world": "prod", "object_type": "Order", "pk": "id"}]}).decode()


# --- 1. the ingest's options live in the one settings object ----------------------------------------


def test_cdc_options_are_settings_read_from_causeway_cdc_variables() -> None:
    env = {
        "CAUSEWAY_CDC_MAPPING": INLINE,
        "CAUSEWAY_CDC_PATTERN": r"^cdc\.raw\.erp\..*",
        "CAUSEWAY_CDC_GROUP_ID": "erp-ingest",
        "CAUSEWAY_CDC_MAX_RECORDS": "40",
        "CAUSEWAY_CDC_DLQ_MAX_VALUE_BYTES": "1000",
        "CAUSEWAY_CDC_ENSURE_TOPICS": "false",
    }
    settings = Settings.from_env(env)
    ingest = CdcIngest(settings, MAPPING)  # its tunables are the settings' cdc_* fields
    s = ingest.settings
    assert (s.cdc_pattern, ingest.group_id, s.cdc_max_records) == (r"^cdc\.raw\.erp\..*", "erp-ingest", 40)
    assert (s.cdc_dlq_max_value_bytes, s.cdc_ensure_topics) == (1000, False)
    assert ingest.max_request_bytes == max(s.max_event_bytes, 1000) + MESSAGE_HEADROOM_BYTES


def test_causeway_config_shows_the_cdc_settings() -> None:
    from cli.main import cli

    env = {"CAUSEWAY_CDC_PATTERN": r"^cdc\.raw\.erp\..*"}
    out = CliRunner().invoke(cli, ["config"], env=env)
    assert out.exit_code == 0, out.output
    assert "cdc_pattern" in out.output and r"^cdc\\.raw\\.erp\\..*" in out.output
    table = CliRunner().invoke(cli, ["config", "--markdown"]).output
    for name in ("CAUSEWAY_CDC_MAPPING", "CAUSEWAY_CDC_PATTERN", "CAUSEWAY_CDC_GROUP_ID", "CAUSEWAY_CDC_MAX_RECORDS"):
        assert f"`{name}`" in table
        assert f"`{name}`" in (ROOT / "README.md").read_text()


def test_docs_cdc_lists_every_cdc_setting_and_metric() -> None:
    text = (ROOT / "docs" / "cdc.md").read_text()
    for f in dataclasses.fields(Settings):
        if f.name.startswith("cdc_"):
            assert f"`CAUSEWAY_{f.name.upper()}`" in text, f"docs/cdc.md does not list {f.name}"
    for info in Metrics().catalog:
        if info.name.startswith("causeway_cdc_"):
            assert f"`{info.name}" in text, f"docs/cdc.md does not list {info.name}"


def test_the_worker_attaches_the_ingest_with_the_settings_options() -> None:
    from agents.cdc import attached_ingest
    from agents.worker import build_worker

    settings = Settings(
        cdc_mapping=INLINE,
        cdc_pattern=r"^cdc\.raw\.erp\..*",
        cdc_group_id="erp-ingest",
        cdc_max_records=40,
        cdc_ensure_topics=False,
    )
    app, _ = build_worker(settings)
    ingest = attached_ingest(app)
    assert ingest is not None
    s = ingest.settings
    assert (s.cdc_pattern, ingest.group_id, s.cdc_max_records, s.cdc_ensure_topics) == (
        r"^cdc\.raw\.erp\..*",
        "erp-ingest",
        40,
        False,
    )
    assert ingest.group_id == "erp-ingest"
    assert attached_ingest(build_worker(Settings())[0]) is None  # no mapping: no ingest


# --- 2. an event too large for its topic is dead-lettered, the batch goes on --------------------------


def test_an_event_over_its_topics_limit_is_dead_lettered_as_event_too_large() -> None:
    big = good(1, note="x" * 3_000)
    recs = [Rec(TOPIC, 0, 10, good(0)), Rec(TOPIC, 0, 11, big, headers=[("trace", b"t")]), Rec(TOPIC, 0, 12, good(2))]
    plan = plan_batch(recs, MAPPING, SETTINGS, now_ms=5, limits={"objs": 2_000, "dlq": 100_000})
    assert plan.events == 2 and plan.rejected == {TOO_LARGE: 1}
    assert [o.key for o in plan.outgoing if o.topic == "objs"] == [b"prod::0", b"prod::2"]
    (dl_out,) = [o for o in plan.outgoing if o.topic == "dlq"]
    letter = DeadLetter.from_record(dl_out.key, dl_out.value, dl_out.headers)
    assert (letter.reason, letter.offset, letter.value, letter.world_id) == (TOO_LARGE, 11, big, "prod")
    assert "accepts 2000 (max.message.bytes)" in letter.detail
    assert plan.commit == {(TOPIC, 0): 13}  # the offset moves past it
    # Without limits nothing changes (every event fits the 4096-byte max_event_bytes).
    assert plan_batch(recs, MAPPING, SETTINGS, now_ms=5).events == 3


def test_records_the_broker_refused_are_dead_lettered_and_the_value_dropped_when_over_the_dlq_limit() -> None:
    recs = [Rec(TOPIC, 0, 10, good(0)), Rec(TOPIC, 0, 11, good(1))]
    plan = plan_batch(recs, MAPPING, SETTINGS, 5, dlq_max_value_bytes=10, too_large={(TOPIC, 0, 11): "refused"})
    assert plan.events == 1 and plan.rejected == {TOO_LARGE: 1}
    dl = plan.outgoing[-1]
    assert dl.value is None and dict(dl.headers or [])[H_REASON] == TOO_LARGE.encode()
    assert b"re-read it from cdc.raw.erp.orders/0@11" in dict(dl.headers or [])[H_DETAIL]


def test_topics_causeway_creates_fit_max_event_bytes_and_small_ones_are_warned_about() -> None:
    s = Settings(objects_topic="o", links_topic="l", dlq_topic="d", max_event_bytes=2_000_000)
    needed = message_bytes_needed(s)
    assert needed == {"o": 2_000_000 + MESSAGE_HEADROOM_BYTES, "l": 2_000_000 + MESSAGE_HEADROOM_BYTES,
                      "d": 2_000_000 + MESSAGE_HEADROOM_BYTES}  # fmt: skip
    (line,) = limit_warnings({"o": 1_048_588, "l": 3_000_000}, needed)
    assert "topic o has max.message.bytes=1048588" in line and TOO_LARGE in line


def test_topics_causeway_creates_never_refuse_what_the_worker_would_dead_letter_as_oversized() -> None:
    # Below the broker's default limit the worker, not the producer's send, refuses an oversized event,
    # so the producer gets a dead letter with reason "oversized" instead of a produce error.
    s = Settings(objects_topic="o", links_topic="l", dlq_topic="d", max_event_bytes=500_000)
    assert set(message_bytes_needed(s).values()) == {BROKER_DEFAULT_MESSAGE_BYTES}


# --- 3. a tenant move the ingest cannot see is warned about, once per table --------------------------


def test_updates_without_the_before_world_are_counted_and_warned_about_once(caplog: Any) -> None:
    recs = [Rec("cdc.raw.erp.tenanted", 0, i, j(payload("u", after={"id": i, "tenant": "acme"}))) for i in range(3)]
    plan = plan_batch(recs, MAPPING, SETTINGS, 0)
    assert plan.events == 3 and plan.world_unchecked == {"tables[1]": 3}
    ingest = CdcIngest(SETTINGS, MAPPING)
    with caplog.at_level("WARNING", logger="agents.cdc"):
        ingest._count(recs, plan)
        ingest._count(recs, plan)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "tables[1] (cdc.raw.erp.tenanted) takes its world from column 'tenant'" in line
    assert "REPLICA IDENTITY FULL" in line
    assert ingest.stats.world_unchecked == {"tables[1]": 6}


# --- 4. counters become metrics, a rate-limited log line and a status -----------------------------


def test_batch_counters_become_metrics() -> None:
    metrics = Metrics()
    ingest = CdcIngest(SETTINGS.replace(cdc_log_interval_s=0), MAPPING, metrics=metrics)
    recs = [Rec(TOPIC, 0, 1, good(1)), Rec(TOPIC, 0, 2, None), Rec(TOPIC, 0, 3, j({"ts_ms": 1})),
            Rec(TOPIC, 0, 4, good(2, note="x" * 3_000))]  # fmt: skip
    plan = plan_batch(recs, MAPPING, SETTINGS, 0, limits={"objs": 2_000})
    ingest._count(recs, plan)
    ingest._record(plan, committed_at=1234.5)
    ingest._failed("produce", RuntimeError("broker down"))
    text = generate_latest(metrics.registry).decode()
    assert 'causeway_cdc_records_skipped_total{reason="tombstone"} 1.0' in text
    assert 'causeway_cdc_records_skipped_total{reason="heartbeat"} 1.0' in text
    assert "causeway_cdc_events_produced_total 1.0" in text
    assert 'causeway_cdc_failures_total{reason="event-too-large"} 1.0' in text
    assert 'causeway_cdc_failures_total{reason="produce"} 1.0' in text
    assert "causeway_cdc_last_commit_timestamp_seconds 1234.5" in text
    assert 'causeway_dead_letters_total{reason="event-too-large",topic="cdc.raw.erp.orders"} 1.0' in text
    assert ingest.stats.produce_failures == 1 and ingest.last_failure == "produce: RuntimeError('broker down')"


def test_the_counters_line_is_rate_limited_and_says_what_changed(caplog: Any) -> None:
    ingest = CdcIngest(SETTINGS.replace(cdc_log_interval_s=60), MAPPING)
    t0 = ingest._logged_at
    ingest.stats.consumed, ingest.stats.events = 10, 7
    ingest.stats.ignored.update({"heartbeat": 3})
    with caplog.at_level("INFO", logger="agents.cdc"):
        assert not ingest._maybe_log(t0 + 30)  # too soon
        assert ingest._maybe_log(t0 + 61)
        assert not ingest._maybe_log(t0 + 200)  # nothing new since the last line
    (line,) = [r.getMessage() for r in caplog.records]
    assert "10 records in 61s; 7 events; skipped heartbeat 3; dead-lettered 0; produce failures 0" in line
    before = IngestStats(consumed=1)
    now = dataclasses.replace(before, consumed=3, rejected=Counter({TOO_LARGE: 2}))
    assert f"dead-lettered {TOO_LARGE} 2" in (counters_line(before, now, 5) or "")


def test_status_is_stalled_only_when_records_wait_without_a_recent_commit() -> None:
    assert IngestStatus(100.0, 100.0, 5, None).stalled(now=200.0, after_s=60)
    assert not IngestStatus(100.0, 190.0, 5, None).stalled(now=200.0, after_s=60)
    assert not IngestStatus(100.0, 100.0, 0, None).stalled(now=200.0, after_s=60)
    assert IngestStatus(100.0, None, 1, "produce: x").stalled(now=200.0, after_s=60)
    ingest = CdcIngest(SETTINGS, MAPPING)
    assert ingest.status() == IngestStatus(None, None, 0, None)  # not started: nothing assigned


# --- 5. mapping errors: all listed, plainly, before anything connects ----------------------------


def test_a_duplicated_topic_entry_with_another_error_is_still_reported() -> None:
    doc = {
        "tables": [
            {"topic": TOPIC, "world": "prod", "object_type": "Order", "pk": "id"},
            {"topic": TOPIC, "world": "prod", "object_type": "Order"},  # no pk, and the topic again
        ]
    }
    try:
        parse_mapping(doc)
    except MappingError as exc:
        problems = exc.problems
    else:
        raise AssertionError("the mapping is invalid")
    assert "tables[1].pk: must be a column name or a non-empty list of column names" in problems
    assert f"tables[1].topic: {TOPIC!r} is already mapped by tables[0]" in problems


def test_standalone_ingest_prints_mapping_problems_plainly_and_exits_non_zero() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CAUSEWAY_CDC_MAPPING": '{"tables": [{"topic": "x"}]}'}
    env["CAUSEWAY_KAFKA_BOOTSTRAP"] = "127.0.0.1:1"  # nothing may connect
    proc = subprocess.run(
        [sys.executable, "-m", "agents.cdc"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "tables[0].topic: 'x' must be a topic name starting with 'cdc.raw.'" in proc.stderr
    assert "tables[0]: give exactly one of 'object_type' or 'link'" in proc.stderr
    assert len(proc.stderr.splitlines()) <= 6
