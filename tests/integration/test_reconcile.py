"""Reconciliation against the real Kafka and Nessie: drift made behind the worker's back is repaired once."""

from __future__ import annotations

import asyncio
import functools
import re
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import pyarrow as pa
import pytest
import yaml
from aiohttp import web
from aiokafka import AIOKafkaProducer
from click.testing import CliRunner
from prometheus_client import generate_latest
from pyiceberg.expressions import EqualTo, In

from agents.reconcile import ControlCount, Reconciler, ReconcileTimer, RunReport, publish_runs, reconcile
from agents.schema_sync import SchemaStore
from cli.main import cli
from cli.workload import Record
from models.events import ChangeEvent, ChangeType, EntityKind
from models.schema import validate_change
from monitoring.metrics import Metrics, serve
from sinks.catalog import NessieCatalog
from sinks.committer import Batch, BatchCommitter, Source
from sinks.nessie import Reference, SyncNessieClient
from sinks.readback import read_world
from streams.settings import Settings, env_name
from tests.factories import change_event
from tests.integration.pipeline import Pipeline

pytestmark = pytest.mark.integration


def event(world: str, typ: str, pk: str, version: int, change: ChangeType = ChangeType.CREATE) -> ChangeEvent:
    return change_event(
        f"{pk}-{version}-{uuid.uuid4().hex[:6]}",
        world=world,
        entity_type=typ,
        pk=pk,
        change=change,
        version=version,
        after=None if change is ChangeType.DELETE else {"n": version, "pk": pk},
        occurred_at_ms=int(time.time() * 1000),
    )


@pytest.fixture
def rec_settings(settings: Settings, warehouse: str, unique: str, nessie_url: str, kafka_bootstrap: str) -> Settings:
    return settings.replace(
        warehouse=warehouse,
        control_counts_topic=f"counts.{unique}",
        commit_backoff_s=0.02,
        app_id=f"cw-{unique}",  # keeps this test's reconciliation records in Redis apart
    )


async def test_drift_behind_the_workers_back_is_detected_repaired_and_second_run_is_a_noop(
    rec_settings: Settings, unique: str
) -> None:
    s = rec_settings
    world = f"t{unique}"
    client = SyncNessieClient(s.nessie_url)
    branch = f"world-{world}"
    client.create_branch(branch, Reference("main", "BRANCH", client.config().no_ancestor_hash))
    committer = BatchCommitter(s, client)
    evs = [event(world, "Pump", f"p{i}", 1) for i in range(20)] + [event(world, "Valve", f"v{i}", 1) for i in range(5)]
    evs += [event(world, "Pump", "p0", 2), event(world, "Pump", "p1", 2, ChangeType.DELETE)]
    items = [(e, Source("objs", 0, i)) for i, e in enumerate(evs)]
    committer.commit_batch(Batch.from_sources(world, "b1", items))
    before = read_world(s, world)

    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        for c in (ControlCount(world, "Pump", 19, 1), ControlCount(world, "Valve", 5, 1)):
            await producer.send_and_wait(s.control_counts_topic, c.encode(), key=c.key)
    finally:
        await producer.stop()

    # A typed column for Pump.n: repaired rows must come back typed, not only as JSON.
    typed = validate_change(
        {"change_id": "n1", "world_id": world, "kind": "object", "type_name": "Pump", "version": 1, "occurred_at": 0,
         "changes": [{"op": "add", "id": "n", "name": "n", "type": "long"}]}
    )  # fmt: skip
    assert SchemaStore(s, committer).apply(typed).verdict == "applied"

    metrics = Metrics()
    rec = Reconciler(s, committer, metrics)
    clean = await reconcile(s, [world], reconciler=rec)
    assert clean[0].outcome == "ok" and clean[0].drift == {"Pump": 0, "Valve": 0}

    # Behind the worker's back: a direct commit that deletes rows (pyiceberg copy-on-write delete).
    cat = committer.catalog(branch)
    cat.load_table("onto.entity_common").delete(In("object_pk", ["p0", "p5", "p6", "v2"]))
    assert len(read_world(s, world).objects) == len(before.objects) - 4

    dry = await reconcile(s, [world], reconciler=rec, dry_run=True)
    assert dry[0].outcome == "ok" and dry[0].drift == {"Pump": 3, "Valve": 1}
    head = client.get_reference(branch).hash

    repaired = await reconcile(s, [world], reconciler=rec)
    r = repaired[0]
    assert r.outcome == "repaired" and r.drift == {"Pump": 3, "Valve": 1}
    assert r.types["Pump"].projection == 16 and r.types["Pump"].log == 19 and r.types["Pump"].control == 19
    after = read_world(s, world)
    assert after.objects == before.objects
    typed_rows = cat.load_table("onto.entity_common").scan(selected_fields=("object_pk", "p_pump__n", "deleted"))
    by_pk = {r["object_pk"]: r["p_pump__n"] for r in typed_rows.to_arrow().to_pylist() if not r["deleted"]}
    assert by_pk["p0"] == 2 and by_pk["p5"] == 1 and by_pk["v2"] is None
    assert client.get_reference(branch).hash != head

    reg = metrics.registry
    assert reg.get_sample_value("causeway_reconciliation_runs_total", {"world": world, "outcome": "repaired"}) == 1
    assert reg.get_sample_value("causeway_reconciliation_repairs_total", {"world": world}) == 2
    assert reg.get_sample_value("causeway_reconciliation_drift", {"world": world, "object_type": "Pump"}) == 3
    assert reg.get_sample_value("causeway_reconciliation_last_run_timestamp_seconds", {"world": world}) > 0

    # Twice in a row: the second run finds nothing and commits nothing.
    head = client.get_reference(branch).hash
    again = await reconcile(s, [world], reconciler=rec)
    assert again[0].outcome == "ok" and again[0].drift == {"Pump": 0, "Valve": 0} and again[0].commit is None
    assert client.get_reference(branch).hash == head
    assert reg.get_sample_value("causeway_reconciliation_runs_total", {"world": world, "outcome": "ok"}) == 2
    assert reg.get_sample_value("causeway_reconciliation_drift", {"world": world, "object_type": "Pump"}) == 0


def test_cli_reports_per_type_counts(rec_settings: Settings, unique: str) -> None:
    s = rec_settings
    world = f"t{unique}"
    with SyncNessieClient(s.nessie_url) as client:
        client.create_branch(f"world-{world}", Reference("main", "BRANCH", client.config().no_ancestor_hash))
        BatchCommitter(s, client).commit_batch(
            Batch.from_sources(world, "b1", [(event(world, "Pump", "p1", 1), Source("objs", 0, 0))])
        )
    env = {env_name(k): (v.reveal() if hasattr(v, "reveal") else str(v)) for k, v in vars(s).items()}
    result = CliRunner().invoke(cli, ["reconcile", "--world", world, "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    assert f"{world}: ok (dry run)" in result.output and "Pump" in result.output


# --- helpers for the tests below ------------------------------------------------------------------


def cli_env(s: Settings) -> dict[str, str]:
    return {env_name(k): (v.reveal() if hasattr(v, "reveal") else str(v)) for k, v in vars(s).items()}


def make_world(s: Settings, world: str, pks: list[str], typ: str = "Pump") -> BatchCommitter:
    """A world branch holding one CREATE per pk; returns the committer used."""
    client = SyncNessieClient(s.nessie_url)
    client.create_branch(f"world-{world}", Reference("main", "BRANCH", client.config().no_ancestor_hash))
    committer = BatchCommitter(s, client)
    items = [(event(world, typ, pk, 1), Source("objs", 0, i)) for i, pk in enumerate(pks)]
    committer.commit_batch(Batch.from_sources(world, f"b-{world}", items))
    return committer


async def publish_counts(s: Settings, *counts: ControlCount) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        for c in counts:
            await producer.send_and_wait(s.control_counts_topic, c.encode(), key=c.key)
    finally:
        await producer.stop()


def summary(output: str) -> dict[str, str]:
    """The command's summary block (after its ``--- reconcile ... ---`` line) as {row: value}."""
    block = output.split("--- reconcile", 1)[1].splitlines()[1:]
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in block if line.strip())


def props_of(cat: NessieCatalog, pk: str) -> dict[str, object]:
    t = cat.load_table("onto.entity_common").scan(selected_fields=("object_pk", "properties", "deleted")).to_arrow()
    live = [r for r in t.to_pylist() if r["object_pk"] == pk and not r["deleted"]]
    assert len(live) == 1, live
    return orjson.loads(live[0]["properties"])


# --- issue 19.4: contents ---------------------------------------------------------------------------


async def test_a_row_edited_by_hand_keeping_version_and_event_id_is_found_and_rebuilt(
    rec_settings: Settings, unique: str
) -> None:
    s = rec_settings
    world = f"t{unique}"
    committer = make_world(s, world, ["p1", "p2", "p3"])
    cat = committer.catalog(f"world-{world}")
    table = cat.load_table("onto.entity_common")
    row = table.scan(row_filter=EqualTo("object_pk", "p2")).to_arrow()
    i = row.schema.get_field_index("properties")
    edited = row.set_column(i, "properties", pa.array(['{"n":999,"pk":"p2"}'], row.schema.field(i).type))
    table.delete(EqualTo("object_pk", "p2"))
    cat.load_table("onto.entity_common").append(edited)
    assert props_of(cat, "p2") == {"n": 999, "pk": "p2"}  # same version and event id, other contents

    rec = Reconciler(s, committer, Metrics())
    found = await reconcile(s, [world], reconciler=rec, dry_run=True)
    assert found[0].drift == {"Pump": 1} and found[0].types["Pump"].mismatched == 1
    fixed = await reconcile(s, [world], reconciler=rec)
    assert fixed[0].outcome == "repaired" and fixed[0].types["Pump"].repaired == 1
    assert props_of(committer.catalog(f"world-{world}"), "p2") == {"n": 1, "pk": "p2"}
    again = await reconcile(s, [world], reconciler=rec)
    assert again[0].outcome == "ok" and again[0].drift == {"Pump": 0} and again[0].commit is None


# --- issue 13: a pass reads what changed since the last one ----------------------------------------


async def test_a_second_pass_reads_only_the_files_committed_since_and_still_finds_drift(
    rec_settings: Settings, unique: str
) -> None:
    # Four key buckets (the default is type only): the delete behind the worker's back then
    # rewrites one bucket's file, not the type's only file, which the second pass must read whole.
    s = rec_settings.replace(projection_buckets=4)
    world = f"t{unique}"
    committer = make_world(s, world, [f"p{i}" for i in range(200)])
    rec = Reconciler(s, committer, Metrics())
    first = await reconcile(s, [world], reconciler=rec, dry_run=True)
    assert first[0].drift == {"Pump": 0}
    assert rec.checkpoints[world].read_rows == 400  # the whole world: 200 log rows, 200 projection rows

    items = [(event(world, "Pump", f"q{i}", 1), Source("objs", 1, i)) for i in range(3)]
    committer.commit_batch(Batch.from_sources(world, f"b2-{world}", items))
    cat = committer.catalog(f"world-{world}")
    cat.load_table("onto.entity_common").delete(EqualTo("object_pk", "p7"))  # drift behind the worker's back
    second = await reconcile(s, [world], reconciler=rec, dry_run=True)
    assert second[0].drift == {"Pump": 1} and second[0].types["Pump"].projection == 202
    # the flush's 3 log rows and what the delete rewrote of the projection; not the 200 seeded log rows
    assert rec.checkpoints[world].read_rows < 200


# --- issues 19.5 and 19.10: the command's errors, summary and exit codes -------------------------------


def test_cli_errors_are_one_line_and_exit_codes_tell_found_repaired_and_unrepairable_apart(
    rec_settings: Settings, unique: str
) -> None:
    s = rec_settings
    world = f"t{unique}"
    committer = make_world(s, world, ["p1", "p2", "p3"])
    env = cli_env(s)
    runner = CliRunner()

    def run(*args: str, **overrides: str) -> Any:
        return runner.invoke(cli, ["reconcile", *args], env={**env, **overrides})

    for args, code, text in (
        (["--world", "nosuch"], 2, "no such world: nosuch"),
        (["--world", "Bad World"], 2, "'Bad World' is not a world id"),
        ([], 2, "--world W (repeatable) or --all"),
    ):
        r = run(*args)
        assert r.exit_code == code, (args, r.output, r.stderr)
        assert r.exception is None or isinstance(r.exception, SystemExit)
        assert text in r.stderr and "Traceback" not in r.stderr + r.output
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    down = run("--world", world, CAUSEWAY_KAFKA_BOOTSTRAP="127.0.0.1:1")
    # A service down is the CLI's preflight verdict, the same for every command (docs/operations.md).
    assert down.exit_code == 4 and "Kafka unavailable at 127.0.0.1:1" in down.stderr, down.stderr
    assert len(down.stderr.strip().splitlines()) == 1, down.stderr
    assert "Traceback" not in down.stderr + down.output

    committer.catalog(f"world-{world}").load_table("onto.entity_common").delete(In("object_pk", ["p1"]))
    dry = run("--world", world, "--dry-run")
    assert dry.exit_code == 3, dry.output + dry.stderr
    assert summary(dry.output)["would repair"].startswith("1 row(s) in 1 world(s)")
    assert summary(dry.output)["exit code"] == "3 (dry run found rows to repair)"
    fixed = run("--world", world)
    assert fixed.exit_code == 0, fixed.output + fixed.stderr
    block = summary(fixed.output)
    assert block["repaired"] == "1 row(s) in 1 world(s)" and block["consistent"] == "0"
    assert block["metrics"] == "recorded in Redis for Prometheus" and block["exit code"] == "0 (consistent)"

    # The control plane counts 5 Pumps; the log holds 3: found, not repairable, exit 3.
    asyncio.run(publish_counts(s, ControlCount(world, "Pump", 5, 1)))
    head = committer.client.get_reference(f"world-{world}").hash
    left = run("--world", world)
    assert left.exit_code == 5, left.output + left.stderr
    block = summary(left.output)
    assert block["cannot repair"].startswith(f"{world}/Pump: control count 5, event log 3")
    assert "a rebuild cannot fix it" in block["cannot repair"] and block["exit code"].startswith("5 ")
    assert committer.client.get_reference(f"world-{world}").hash == head  # nothing to rebuild, no commit
    as_json = run("--world", world, "--json")
    doc = orjson.loads(as_json.stdout)
    assert as_json.exit_code == 5 and doc["exit_code"] == 5
    assert doc["reports"][0]["types"]["Pump"]["unrepairable"] is True


# --- issues 19.8 / 24.6: the timer's scope and the series it leaves -------------------------------------


def world_labels(metrics: Metrics) -> set[str]:
    return {s.labels["world"] for m in metrics.registry.collect() for s in m.samples if "world" in s.labels}


async def test_a_timer_pass_covers_only_its_scope_and_bounds_the_series(rec_settings: Settings, unique: str) -> None:
    served, matched, other = f"t{unique}-a", f"t{unique}-b1", f"t{unique}-other"
    s = rec_settings.replace(reconcile_worlds=f"served,t{unique}-b*")
    committers = {w: make_world(s, w, ["p1", "p2", "p3"]) for w in (served, matched, other)}
    for w in (served, other):  # drift in a world in scope and in one out of it
        committers[w].catalog(f"world-{w}").load_table("onto.entity_common").delete(In("object_pk", ["p1"]))
    other_head = committers[other].client.get_reference(f"world-{other}").hash

    metrics = Metrics()
    timer = ReconcileTimer(s, metrics, served=lambda: {served, "a-world-without-branch"})
    try:
        reports = await timer.run_pass()
    finally:
        await timer.stop()
    assert {r.world_id: r.outcome for r in reports} == {served: "repaired", matched: "ok"}
    # Another deployment's world (same Nessie, not in scope) is neither read nor repaired.
    assert committers[other].client.get_reference(f"world-{other}").hash == other_head
    assert world_labels(metrics) == {served, matched}
    # The documented bound (docs/metrics.md): per world in scope at most 15 + T series (T: object types).
    # (``*_created`` samples are switched off in a worker, see monitoring.metrics.register_faust_sensors.)
    per_world = [
        sum(
            1
            for m in metrics.registry.collect()
            for x in m.samples
            if x.labels.get("world") == w and not x.name.endswith("_created")
        )
        for w in (served, matched)
    ]
    assert all(n <= 15 + 1 for n in per_world), per_world


# --- issue 24.7: a pass does not starve the worker's event loop ----------------------------------------


def hold_the_gil(world: str) -> None:
    """A step that holds the GIL for seconds, like a big Arrow → Python conversion (a C regex never releases it)."""
    re.match(r"(a+)+$", "a" * 26 + "b")


async def scrape_while(task: asyncio.Future[Any], url: str) -> list[float]:
    """Scrape ``url`` until ``task`` is done; each scrape's seconds from request to full answer, plus
    how late the loop woke up from the pause after it: a step that takes the GIL while the loop sleeps
    stalls the wake-up, not a request in flight, and must count too (a fresh-clone run missed it)."""
    pause = 0.1
    took: list[float] = []
    async with aiohttp.ClientSession() as http:
        while not task.done():
            t0 = time.monotonic()
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=60)) as resp:
                assert resp.status == 200
                await resp.read()
            await asyncio.sleep(pause)
            took.append(time.monotonic() - t0 - pause)
    return took


async def test_scrapes_are_answered_while_a_pass_runs_a_step_that_holds_the_gil(
    rec_settings: Settings, unique: str
) -> None:
    world = f"t{unique}"
    s = rec_settings.replace(reconcile_worlds=world)
    make_world(s, world, ["p1", "p2"])
    metrics = Metrics()

    async def page(request: web.Request) -> web.Response:  # the worker's /metrics, on its event loop
        return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/metrics"  # type: ignore[union-attr]
    timer = ReconcileTimer(s, metrics, before_world=hold_the_gil)
    try:
        # The hazard: the same step on a thread of the worker's process stalls every scrape.
        in_process = await scrape_while(asyncio.ensure_future(asyncio.to_thread(hold_the_gil, world)), url)
        # The timer runs it in its child process: scrapes keep being answered during the whole pass.
        pass_task = asyncio.ensure_future(timer.run_pass())
        during = await scrape_while(pass_task, url)
        reports = pass_task.result()
    finally:
        await timer.stop()
        await runner.cleanup()
    print(f"\nworst scrape: {max(in_process):.2f}s with the step in-process, {max(during):.2f}s during the pass")
    assert [r.outcome for r in reports] == ["ok"]
    # The control shows the test can see starvation; relative, since the step's length depends on the box.
    assert max(in_process) > 5 * max(during), (in_process, during)
    assert len(during) >= 10 and max(during) < 1.0, during
    assert metrics.registry.get_sample_value("causeway_reconciliation_runs_total", {"world": world, "outcome": "ok"})


# --- issue 19.9: the CLI-only setup feeds CausewayReconciliationStale -----------------------------------

RULES = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus" / "rules" / "causeway.yml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_promtool_stale_alert_fires_on_what_a_worker_exports_after_a_cli_run(tmp_path: Path, promtool: str) -> None:
    """The series a worker exports from a CLI run's record (no runs_total, no worker timer) fires the alert."""
    rule = next(
        r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
        if r.get("alert") == "CausewayReconciliationStale"
    )  # fmt: skip
    fill = {"{{ $labels.world }}": "w1", "{{ $value | humanizeDuration }}": "20m 0s"}
    notes = {k: functools.reduce(lambda t, kv: t.replace(*kv), fill.items(), v) for k, v in rule["annotations"].items()}
    case = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                # A CLI run at t=0 (Unix time 0 in promtool), read back by one worker; no later run.
                "input_series": [
                    {
                        "series": 'causeway_reconciliation_last_run_timestamp_seconds{job="causeway",'
                        'instance="127.0.0.1:6066",world="w1"}',
                        "values": "0x30",
                    }
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "CausewayReconciliationStale", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "CausewayReconciliationStale",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "warning", "world": "w1"}, "exp_annotations": notes}
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "stale_test.yml"
    path.write_text(orjson.dumps(case).decode())  # JSON is YAML
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


class PrivatePrometheus:
    """A Prometheus of this test only (own port, own data dir) scraping one target with the project's rules."""

    def __init__(self, tmp_path: Path, target: str) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "causeway", "static_configs": [{"targets": [target]}]}],
        }
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(orjson.dumps(config).decode())
        self.log = (tmp_path / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def alerts(self, name: str, world: str) -> list[dict[str, Any]]:
        try:
            doc = httpx.get(f"{self.url}/api/v1/alerts", timeout=5).json()
        except (httpx.HTTPError, ValueError):  # not up yet ("Service Unavailable")
            return []
        return [
            a
            for a in doc["data"]["alerts"]
            if a["labels"].get("alertname") == name and a["labels"].get("world") == world
        ]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def wait_until(predicate: Any, timeout: float, what: str) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(predicate):
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def test_cli_only_setup_the_stale_alert_fires_on_a_live_prometheus_and_a_cli_run_resolves_it(
    rec_settings: Settings, unique: str, tmp_path: Path
) -> None:
    world = f"t{unique}"
    s = rec_settings.replace(reconcile_interval_s=0.0)  # the documented CLI-only setup: no timer in workers
    make_world(s, world, ["p1"])
    # The last CLI run of this world finished 20 minutes ago (recorded as the CLI records it).
    await publish_runs(s, [RunReport(world, "ok", {}, finished_at=time.time() - 1200)])

    metrics = Metrics()
    timer = ReconcileTimer(s, metrics, readback_interval_s=0.5)  # what attach() runs in every worker
    task = asyncio.ensure_future(timer.run())
    port = free_port()
    server = serve(metrics, port)
    prom = PrivatePrometheus(tmp_path, f"127.0.0.1:{port}")
    try:
        await wait_until(
            lambda: any(a["state"] == "firing" for a in prom.alerts("CausewayReconciliationStale", world)),
            timeout=90,
            what="CausewayReconciliationStale to fire",
        )
        result = await asyncio.to_thread(CliRunner().invoke, cli, ["reconcile", "--world", world], env=cli_env(s))
        assert result.exit_code == 0, result.output
        await wait_until(
            lambda: not prom.alerts("CausewayReconciliationStale", world), timeout=90, what="the alert to resolve"
        )
        assert summary(result.output)["metrics"] == "recorded in Redis for Prometheus"
        exported = metrics.registry.get_sample_value(
            "causeway_reconciliation_last_run_timestamp_seconds", {"world": world}
        )
        assert exported is not None and time.time() - exported < 120
    finally:
        prom.stop()
        server.shutdown()
        await timer.stop()
        task.cancel()


# --- the timer inside a real worker process -------------------------------------------------------------


async def test_a_worker_reconciles_the_worlds_it_serves_in_a_child_process(unique: str, tmp_path: Path) -> None:
    """A `causeway worker` with the default scope reconciles exactly the worlds it applied events for."""
    pipe = await Pipeline.create(unique, tmp_path, reconcile_interval_s=3.0, batch_max_seconds=0.2)
    worlds = [f"t{unique[:8]}-w{i}" for i in range(2)]
    records = []
    for w in worlds:
        for i in range(5):
            ev = event(w, "Pump", f"p{i}", 1)
            records.append(Record(EntityKind.OBJECT, ev.key.encode(), ev.encode(), ev))
    try:
        worker = pipe.start_worker()
        await pipe.publish(records)
        await pipe.wait_drained(60)

        def reconciled() -> set[str]:
            text = worker.metrics_text()
            return set(re.findall(r'causeway_reconciliation_runs_total\{[^}]*world="([^"]+)"', text))

        await wait_until(lambda: reconciled() == set(worlds), timeout=90, what="a pass over the served worlds")
        assert worker.alive()
        text = worker.metrics_text()
        assert all(f'world="{w}",outcome="ok"' in text or f'outcome="ok",world="{w}"' in text for w in worlds), text
        # Every world label on the worker is one it serves (plus the pseudo-worlds of bad input).
        labels = set(re.findall(r'world="([^"]+)"', text)) - {"all", "unknown", "invalid"}
        assert labels == set(worlds), labels
    finally:
        pipe.stop_all()


def sleep_a_minute(world: str) -> None:
    time.sleep(60)


async def test_stopping_the_timer_ends_a_pass_in_progress(rec_settings: Settings, unique: str) -> None:
    """A worker that is asked to stop does not wait for a long world to finish reconciling."""
    world = f"t{unique}"
    s = rec_settings.replace(reconcile_worlds=world)
    make_world(s, world, ["p1"])
    timer = ReconcileTimer(s, Metrics(), before_world=sleep_a_minute)
    pass_task = asyncio.ensure_future(timer.run_pass())
    await wait_until(lambda: timer._pool is not None and bool(timer._pool._processes), 60, "the child process")
    children = list(timer._pool._processes.values())  # type: ignore[union-attr]
    await asyncio.sleep(1.0)
    t0 = time.monotonic()
    await timer.stop()
    with pytest.raises(Exception):  # noqa: B017, PT011 - the abandoned world's future fails (broken pool)
        await asyncio.wait_for(pass_task, 30)
    assert time.monotonic() - t0 < 45  # well before the hook's 60 s
    assert not any(c.is_alive() for c in children)


async def test_the_timer_child_drops_the_checkpoints_of_worlds_that_left_its_scope(
    rec_settings: Settings, unique: str
) -> None:
    """A checkpoint is ~200 bytes per key: the child must not keep one for a world it no longer reconciles."""
    first, second = f"k{unique}-a", f"k{unique}-b"
    for w in (first, second):
        make_world(rec_settings, w, ["p1", "p2"])
    served = {first, second}
    timer = ReconcileTimer(rec_settings.replace(reconcile_worlds="served"), Metrics(), served=lambda: set(served))
    try:
        assert {r.world_id: r.outcome for r in await timer.run_pass()} == {first: "ok", second: "ok"}
        assert await timer.held_checkpoints() == sorted([first, second])
        served.discard(second)  # the worker no longer serves it (a rebalance, a deleted world)
        assert [r.world_id for r in await timer.run_pass()] == [first]
        assert await timer.held_checkpoints() == [first]
    finally:
        await timer.stop()
