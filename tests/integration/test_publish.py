"""Write-Audit-Publish gate against the real Nessie: audits, approval, run, moved heads, twice, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from sinks.errors import NessieNotFound
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Secret, Settings
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import obj
from tests.integration.worlds_fixtures import WrittenWorld
from tests.webhooks import serve_hook
from worlds.api import Worlds
from worlds.publish import Thresholds, Verdict
from worlds.publish_run import Publisher

pytestmark = pytest.mark.integration
world_settings, wclient, written, api = fx.world_settings, fx.wclient, fx.written, fx.api
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gate(api: Worlds, unique: str, wclient: SyncNessieClient) -> Iterator[Publisher]:
    p = Publisher(api, log_branch=f"publish-log-{unique}")
    yield p
    fx.cleanup_refs(wclient, unique)


@pytest.fixture
def local_hook() -> Iterator[tuple[str, Any]]:
    with serve_hook() as h:
        yield h


def fork(written: WrittenWorld, api: Worlds, name: str) -> WrittenWorld:
    head = api.head(written.world)
    api.client.create_branch(f"world-{name}", Reference(head.name, "BRANCH", head.hash))
    return WrittenWorld(name, f"world-{name}", written.committer, written.client, next_offset=100_000)


@pytest.fixture
def pair(written: WrittenWorld, api: Worlds) -> tuple[WrittenWorld, WrittenWorld]:
    """(target, source): target holds p1..p4; source forked from it."""
    w = written.world
    written.commit("base", [obj(w, f"p{i}", "CREATE", 1, name=f"n{i}") for i in range(1, 5)])
    return written, fork(written, api, f"{w}-etl")


def _objects(api: Worlds, world: str) -> dict[str, str]:
    snap = api.show(world)
    return {r["object_pk"]: orjson.loads(r["properties"])["name"] for r in snap.objects.to_pylist()}


def _source_gone(api: Worlds, world: str) -> bool:
    try:
        api.client.get_reference(api.branch(world))
        return False
    except NessieNotFound:
        return True


def test_eligible_fast_forward_approve_run_verify_delete_and_twice(pair, api: Worlds, gate: Publisher) -> None:
    target, source = pair
    gate.settings = gate.settings.replace(publish_webhook_url=Secret("http://127.0.0.1:1/down"))  # never fails it
    s = source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl"), obj(s, "p9", "CREATE", 1, name="new")])
    rec = gate.audit(s, target.world, Thresholds(), by="ana")
    assert rec.verdict is Verdict.ELIGIBLE and rec.fast_forward
    assert rec.observed.entities == {"added": 1, "removed": 0, "modified": 1}
    assert rec.observed.drift == 0 and rec.observed.tables >= 2
    # the same heads and thresholds give the same plan
    assert gate.audit(s, target.world, Thresholds(), by="bo").plan_id == rec.plan_id

    assert gate.run(rec.plan_id, execute=True).reason.startswith("not approved")
    gate.approve(rec.plan_id, "ana")
    dry = gate.run(rec.plan_id)
    assert dry.outcome == "planned" and api.head(target.world).hash == rec.heads.target_hash

    out = gate.run(rec.plan_id, execute=True)
    assert out.outcome == "published" and out.path == "fast-forward" and out.verified and out.source_deleted
    assert api.head(target.world).hash == rec.heads.source_hash
    assert _objects(api, target.world) == {"p1": "etl", "p2": "n2", "p3": "n3", "p4": "n4", "p9": "new"}
    assert _source_gone(api, s)

    again = gate.run(rec.plan_id, execute=True)
    assert again.action == "done" and again.commit == out.commit
    runs = [e for e in gate.log.entries(rec.plan_id) if e["kind"] == "run"]
    assert [r["outcome"] for r in runs] == ["refused", "published"]  # the second run wrote nothing
    st = gate.status()[s]
    assert st.last_plan == rec.plan_id and st.outcome == "published" and st.first_seen <= st.last_audit


def test_blocked_by_drift_and_by_table_count(pair, api: Worlds, gate: Publisher) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl")])
    for i in range(3):
        target.commit(f"t{i}", [obj(t, "p2", "UPDATE", 2 + i, name=f"t{i}")])
    rec = gate.audit(s, t, Thresholds(max_drift=2), by="ana")
    assert rec.verdict is Verdict.BLOCKED and rec.blocked_by == ["drift"] and rec.observed.drift == 3
    rec2 = gate.audit(s, t, Thresholds(max_drift=5, max_tables=1))
    assert rec2.blocked_by == ["tables"] and rec2.plan_id != rec.plan_id
    with pytest.raises(Exception, match="cannot approve"):
        gate.approve(rec.plan_id, "ana")
    assert gate.run(rec.plan_id, execute=True).reason == "blocked by drift"


def test_blocked_by_conflicts_then_diverged_publish_by_merge(pair, api: Worlds, gate: Publisher) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl")])
    target.commit("t1", [obj(t, "p1", "UPDATE", 2, name="prod")])
    rec = gate.audit(s, t, Thresholds())
    assert rec.blocked_by == ["conflicts"] and rec.observed.conflicts[0]["conflict"] == "MODIFY_MODIFY"

    # a disjoint change instead: the target moved, no conflict -> published by the three-way merge
    source.commit("s2", [obj(s, "p1", "UPDATE", 3, name="prod"), obj(s, "p3", "UPDATE", 2, name="etl3")])
    rec = gate.audit(s, t, Thresholds())
    assert rec.verdict is Verdict.ELIGIBLE and not rec.fast_forward, rec.to_json()
    gate.approve(rec.plan_id, "ana")
    out = gate.run(rec.plan_id, execute=True, keep_source=True)
    assert out.outcome == "published" and out.path == "merge" and out.verified, out.to_json()
    assert api.head(t).hash == out.commit and not _source_gone(api, s)
    assert _objects(api, t)["p3"] == "etl3"


def test_run_refused_when_the_target_moved_after_approval(pair, api: Worlds, gate: Publisher, local_hook) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl")])
    rec = gate.audit(s, t, Thresholds())
    gate.approve(rec.plan_id, "ana")
    moved = target.commit("t1", [obj(t, "p4", "UPDATE", 2, name="late")])
    url, hook = local_hook
    gate.settings = gate.settings.replace(publish_webhook_url=Secret(url))
    out = gate.run(rec.plan_id, execute=True)
    assert out.outcome == "refused" and out.reason.endswith("re-audit")
    (note,) = hook.received
    assert note["text"].startswith("causeway publish blocked") and "re-audit" in note["attachments"][0]["text"]
    assert api.head(t).hash == moved and not _source_gone(api, s)


def test_kill_between_publish_and_delete_is_completed_once(
    pair, api: Worlds, gate: Publisher, world_settings: Settings
) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p2", "UPDATE", 2, name="etl")])
    rec = gate.audit(s, t, Thresholds())
    gate.approve(rec.plan_id, "ana")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CAUSEWAY_WAREHOUSE": world_settings.warehouse,
        "CAUSEWAY_NESSIE_URL": world_settings.nessie_url,
        "CAUSEWAY_PUBLISH_LOG_BRANCH": gate.log.branch,
        "CAUSEWAY_FAULT": "publish-after-commit:1",
    }
    cmd = [sys.executable, "-m", "cli.main", "publish", "run", rec.plan_id, "--execute", "--json"]
    died = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert api.head(t).hash == rec.heads.source_hash  # published ...
    assert not _source_gone(api, s)  # ... but not cleaned up nor logged
    assert not [e for e in gate.log.entries(rec.plan_id) if e["kind"] == "run"]

    env.pop("CAUSEWAY_FAULT")
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = orjson.loads(done.stdout)
    assert out["outcome"] == "published" and out["action"] == "complete" and out["source_deleted"]
    assert api.head(t).hash == rec.heads.source_hash and _source_gone(api, s)
    runs = [e for e in gate.log.entries(rec.plan_id) if e["kind"] == "run"]
    assert [r["outcome"] for r in runs] == ["published"]


def test_drift_timer_audits_a_pending_world_and_exports_its_series(
    pair, api: Worlds, gate: Publisher, world_settings: Settings, unique: str
) -> None:
    from prometheus_client import CollectorRegistry

    from monitoring.publish_metrics import PublishGauges
    from worlds.publish_timer import audit_once

    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl")])
    for i in range(3):
        target.commit(f"t{i}", [obj(t, "p2", "UPDATE", 2 + i, name=f"t{i}")])
    # the target plays prod; the log branch is the test's own
    settings = world_settings.replace(
        prod_world=f"prod{unique}", main_branch=target.branch, publish_log_branch=gate.log.branch, publish_max_drift=2
    )
    reg = CollectorRegistry()
    assert audit_once(settings, PublishGauges(reg), only=unique, now=datetime.now(UTC) + timedelta(days=2)) == [s]
    assert reg.get_sample_value("causeway_world_drift_commits", {"world": s}) == 3
    assert reg.get_sample_value("causeway_publish_blocked", {"world": s, "check": "drift"}) == 1
    assert reg.get_sample_value("causeway_world_staleness_seconds", {"world": s}) > 86_400
    assert gate.status()[s].last_verdict == "blocked"


def test_cli_exit_codes_json_record_decline_and_status(pair, api: Worlds, gate: Publisher, world_settings) -> None:
    from click.testing import CliRunner

    from cli.main import cli

    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl"), obj(s, "p8", "CREATE", 1, name="x")])
    env = {
        "CAUSEWAY_WAREHOUSE": world_settings.warehouse,
        "CAUSEWAY_PUBLISH_LOG_BRANCH": gate.log.branch,
    }
    runner = CliRunner()
    res = runner.invoke(cli, ["publish", "audit", s, "--into", t, "--max-changed-entities", "1", "--json"], env=env)
    assert res.exit_code == 12, res.output
    doc = orjson.loads(res.output)
    assert doc["blocked_by"] == ["entities"] and doc["diff"]["entities_changed"] == 2
    res = runner.invoke(cli, ["publish", "audit", s, "--into", t, "--by", "ana"], env=env)
    assert res.exit_code == 0 and res.output.startswith("ELIGIBLE"), res.output
    pid = res.output.split("plan ")[1].split()[0]
    assert runner.invoke(cli, ["publish", "approve", pid, "--by", "bo", "--decline"], env=env).exit_code == 0
    res = runner.invoke(cli, ["publish", "run", pid, "--execute"], env=env)
    assert res.exit_code == 5 and "declined" in res.output
    res = runner.invoke(cli, ["publish", "run", "pl-0000000000000000"], env=env)
    assert res.exit_code == 1 and "unknown plan" in res.output
    res = runner.invoke(cli, ["publish", "status", "--json"], env=env)
    (row,) = [r for r in orjson.loads(res.output) if r["source"] == s]
    assert row["plan_id"] == pid and row["verdict"] == "eligible" and row["outcome"] == "refused"
    assert api.head(t).hash == gate.record(pid)[0].heads.target_hash  # nothing published
