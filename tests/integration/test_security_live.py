"""The pipeline against a secured stack it starts itself (scripts/services.sh --secure).

Kafka speaks only SASL_SSL with SCRAM, Redis only TLS with a password, Nessie sits behind a token
proxy over HTTPS. The stack runs on free ports in a temporary run dir beside the plain services
(whose Nessie the proxy forwards to) and is stopped at the end of the module. These tests carry the
``secured`` marker: ``-m "not secured"`` skips them in a fast run; the full suite runs them.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cli.workload import expected_state, generate
from tests.integration.pipeline import ROOT, Pipeline, free_port

pytestmark = [pytest.mark.integration, pytest.mark.secured]


@dataclass
class SecureStack:
    env: dict[str, str]  # the CAUSEWAY_* settings of a client of the secured stack
    secrets: list[str]  # every secret value the stack generated
    run_dir: Path

    @property
    def nessie_base(self) -> str:
        return self.env["CAUSEWAY_NESSIE_URL"].removesuffix("/api/v2")

    def oauth_token(self, ttl_s: float | None = None) -> str:
        ca = ssl.create_default_context(cafile=self.env["CAUSEWAY_NESSIE_CA_FILE"])
        data = {"grant_type": "client_credentials"} | ({"ttl_s": str(ttl_s)} if ttl_s else {})
        auth = (self.env["CAUSEWAY_NESSIE_OAUTH_CLIENT_ID"], self.env["CAUSEWAY_NESSIE_OAUTH_CLIENT_SECRET"])
        resp = httpx.post(self.env["CAUSEWAY_NESSIE_OAUTH_TOKEN_URL"], data=data, auth=auth, verify=ca)
        return str(resp.raise_for_status().json()["access_token"])


def _services(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts/services.sh"), "--secure", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, nessie_url: str) -> Iterator[SecureStack]:
    run_dir = tmp_path_factory.mktemp("secure-run")
    env = os.environ | {
        "CAUSEWAY_SECURE_RUN_DIR": str(run_dir),
        "CAUSEWAY_SECURE_KAFKA_PORT": str(free_port()),
        "CAUSEWAY_SECURE_KAFKA_CONTROLLER_PORT": str(free_port()),
        "CAUSEWAY_SECURE_REDIS_PORT": str(free_port()),
        "CAUSEWAY_SECURE_NESSIE_PORT": str(free_port()),
        "CAUSEWAY_SECURE_NESSIE_UPSTREAM": nessie_url.removesuffix("/api/v2"),
        "CAUSEWAY_PYTHON": sys.executable,
    }
    started = _services(env, "start")
    try:
        if started.returncode != 0:
            pytest.fail(f"secured stack did not start:\n{started.stderr[-3000:]}", pytrace=False)
        printed = _services(env, "env").stdout
        client_env = dict(
            line.removeprefix("export ").split("=", 1) for line in printed.splitlines() if line.startswith("export ")
        )
        values = [
            line.split("=", 1)[1]
            for line in (run_dir / "secrets.env").read_text().splitlines()
            if line.split("=", 1)[0].endswith(("PASSWORD", "TOKEN", "SECRET"))
        ]
        yield SecureStack(client_env, values, run_dir)
    finally:
        _services(env, "stop")


@pytest.fixture
def secured(stack: SecureStack, monkeypatch: pytest.MonkeyPatch) -> SecureStack:
    """This process's settings point at the secured stack (Pipeline reads Settings.from_env)."""
    for name, value in stack.env.items():
        monkeypatch.setenv(name, value)
    return stack


def causeway(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, as an operator runs it; stdout and stderr captured."""
    return python_m(env, "cli.main", *args, timeout=timeout)


def python_m(env: dict[str, str], module: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_matches_model(pipe: Pipeline, events: list) -> None:
    for world, want in expected_state(events).items():
        got = pipe.state(world)
        assert not got.duplicate_event_ids
        assert set(got.event_ids) == want.event_ids, world
        assert got.objects == want.objects and got.links == want.links, world


async def committed(pipe: Pipeline) -> int:
    """Sum of the worker group's committed offsets over the change topics (0 when none)."""
    from streams.lag_probe import OffsetProbe
    from streams.security import kafka_client_options

    s = pipe.settings
    probe = OffsetProbe(s.kafka_bootstrap, kafka_options=kafka_client_options(s))
    try:
        parts = await probe.partitions([s.objects_topic, s.links_topic])
        rows = await probe.offsets(s.app_id, parts)
    finally:
        await probe.close()
    return sum(r.committed or 0 for r in rows)


async def test_pipeline_and_every_client_tool_over_tls_and_sasl(secured: SecureStack, unique: str, tmp_path: Path):
    """Publish, apply, commit, read back over SASL_SSL/TLS/OAuth2; then each operator tool once."""
    pipe = await Pipeline.create(unique, tmp_path)
    outputs: list[str] = []
    try:
        wl = generate(pipe.params(events=400, worlds=2, keys=20, seed=7, bad_rate=0.02))
        worker = pipe.start_worker()
        await pipe.publish(wl.records)
        await pipe.wait_drained(timeout=240)
        assert_matches_model(pipe, wl.valid_events)
        letters = await pipe.dead_letters()
        assert len(letters) == wl.bad_count > 0
        for dl in letters:
            outputs.append(repr(dl.headers()))

        env = pipe.env
        doctor = ""
        for args in (
            ("doctor",),
            ("offsets", "show"),
            ("dlq", "list"),
            ("dlq", "redrive", "--all", "--dry-run"),
            ("replay", "--world", "prod", "--wait-parked", "0"),
            ("worlds", "list"),
        ):
            done = causeway(env, *args)
            outputs += [done.stdout, done.stderr]
            # doctor fails on the Prometheus check alone when other helpers' targets are down; a dry-run
            # redrive exits 3 ("incomplete") when its letters are still invalid, as these are.
            ok_codes = {"doctor": (0, 1, 69), "dlq": (0, 3)}.get(args[0], (0,))
            assert done.returncode in ok_codes, f"{args}: {done.returncode} {done.stdout}{done.stderr}"
            assert "Traceback" not in done.stderr, done.stderr
            doctor = doctor or done.stdout
        for service, mode in (("kafka", "SASL_SSL, SCRAM-SHA-512"), ("redis", "TLS"), ("nessie", "OAuth2")):
            line = next(x for x in doctor.splitlines() if x.split()[1:2] == [service])
            assert line.lstrip().startswith("ok") and mode in line, doctor
        replay = outputs[-4]
        assert "complete" in replay and "duplicates" in replay, replay
        # The replay applied nothing new: the branch still equals the model.
        assert_matches_model(pipe, wl.valid_events)
        lag = python_m(env, "monitoring.lag_exporter", "--once", "--json")
        outputs += [lag.stdout, lag.stderr]
        assert lag.returncode == 0 and pipe.settings.objects_topic in lag.stdout, lag.stdout + lag.stderr
        pipe.stop_all()
        reset = causeway(env, "offsets", "reset", "--to", "latest", "--dry-run")
        outputs += [reset.stdout, reset.stderr]
        assert reset.returncode == 0, reset.stdout + reset.stderr
        outputs.append(worker.log.read_text())
    finally:
        pipe.stop_all()
    leaked = [s for s in secured.secrets if any(s in text for text in outputs)]
    assert not leaked, "a secret appeared in the output"


BAD = "wrong-" + secrets.token_hex(8)


@pytest.mark.parametrize(
    ("change", "service", "reason"),
    [
        ({"CAUSEWAY_KAFKA_SASL_PASSWORD": BAD}, "kafka", "authentication failed"),
        ({"CAUSEWAY_KAFKA_SASL_USERNAME": "nobody-" + BAD}, "kafka", "authentication failed"),
        ({"CAUSEWAY_KAFKA_SSL_CA_FILE": ""}, "kafka", "certificate is not trusted"),
        ({"CAUSEWAY_REDIS_PASSWORD": BAD}, "redis", "authentication failed"),
        ({"CAUSEWAY_REDIS_CA_FILE": ""}, "redis", "certificate is not trusted"),
        ({"CAUSEWAY_NESSIE_OAUTH_CLIENT_SECRET": BAD}, "nessie", "answered 401"),
        ({"CAUSEWAY_NESSIE_OAUTH_TOKEN_URL": "", "CAUSEWAY_NESSIE_TOKEN": BAD}, "nessie", "refused the credentials"),
        ({"CAUSEWAY_NESSIE_CA_FILE": ""}, "nessie", "certificate is not trusted"),
    ],
    ids=[
        "kafka-wrong-password",
        "kafka-unknown-user",
        "kafka-untrusted-cert",
        "redis-wrong-password",
        "redis-untrusted-cert",
        "nessie-wrong-client-secret",
        "nessie-wrong-token",
        "nessie-untrusted-cert",
    ],
)
def test_doctor_names_a_wrong_credential_in_one_line(
    stack: SecureStack, change: dict[str, str], service: str, reason: str
) -> None:
    env = os.environ | stack.env | change
    done = causeway(env, "doctor", timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if x.split()[:2] == ["FAIL", service])
    assert reason in line, done.stdout
    assert not [s for s in stack.secrets if s in done.stdout + done.stderr]


def test_expired_token_is_refused_and_a_fresh_one_accepted(stack: SecureStack) -> None:
    ca = ssl.create_default_context(cafile=stack.env["CAUSEWAY_NESSIE_CA_FILE"])
    token = stack.oauth_token(ttl_s=1)
    url = stack.nessie_base + "/api/v2/config"
    assert httpx.get(url, headers={"Authorization": f"Bearer {token}"}, verify=ca).status_code == 200
    time.sleep(1.5)
    assert httpx.get(url, headers={"Authorization": f"Bearer {token}"}, verify=ca).status_code == 401
    env = os.environ | stack.env | {"CAUSEWAY_NESSIE_OAUTH_TOKEN_URL": "", "CAUSEWAY_NESSIE_TOKEN": token}
    done = causeway(env, "doctor", timeout=120)
    assert "refused the credentials" in next(x for x in done.stdout.splitlines() if "nessie" in x)
    # causeway's own OAuth2 client fetches fresh tokens and passes.
    fresh = causeway(os.environ | stack.env, "worlds", "list")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr


async def test_refused_nessie_credentials_apply_nothing_and_lose_nothing(
    secured: SecureStack, unique: str, tmp_path: Path
) -> None:
    """A worker with a wrong Nessie secret commits nothing and acks nothing; the fixed one applies all."""
    pipe = await Pipeline.create(unique, tmp_path)
    try:
        wl = generate(pipe.params(events=200, worlds=1, keys=10, seed=9, bad_rate=0.0))
        await pipe.publish(wl.records)
        good_env = pipe.env
        pipe.env = good_env | {"CAUSEWAY_NESSIE_OAUTH_CLIENT_SECRET": BAD}
        bad = pipe.start_worker(wait=False)
        await asyncio.sleep(25)  # long enough to read, try to apply, and fail
        pipe.kill(bad)
        assert await committed(pipe) == 0, "offsets were committed without a Nessie commit"
        assert not pipe.state("prod").event_ids, "events applied with refused credentials"
        log = bad.log.read_text()
        assert BAD not in log and not [s for s in secured.secrets if s in log]
        pipe.env = good_env
        pipe.start_worker()
        await pipe.wait_drained(timeout=240)
        assert_matches_model(pipe, wl.valid_events)
    finally:
        pipe.stop_all()


async def test_no_secret_in_any_output_of_a_secured_run(secured: SecureStack, unique: str, tmp_path: Path) -> None:
    """Worker at debug level, CLI, doctor, config and a forced error: no secret string anywhere."""
    pipe = await Pipeline.create(unique, tmp_path)
    outputs: list[str] = []
    try:
        pipe.env = pipe.env | {"CAUSEWAY_LOG_LEVEL": "debug"}
        worker = pipe.start_worker()
        wl = generate(pipe.params(events=60, worlds=1, keys=5, seed=2, bad_rate=0.05))
        await pipe.publish(wl.records)
        await pipe.wait_drained(timeout=240)
        for args in (
            ("config",),
            ("--log-level", "debug", "doctor"),
            ("--log-level", "debug", "dlq", "list"),
            ("--log-level", "debug", "offsets", "show"),
        ):
            done = causeway(pipe.env, *args)
            outputs += [done.stdout, done.stderr]
        # A forced error: Redis refuses the password of the URL; the URL (with its password) shows masked.
        url_with_password = pipe.env["CAUSEWAY_REDIS_URL"].replace(
            "rediss://", f"rediss://causeway:{secured.env['CAUSEWAY_REDIS_PASSWORD']}-x@"
        )
        forced_env = pipe.env | {"CAUSEWAY_REDIS_URL": url_with_password}
        forced = causeway(forced_env, "--log-level", "debug", "doctor")
        shown = causeway(forced_env, "config")
        outputs += [forced.stdout, forced.stderr, shown.stdout, shown.stderr]
        assert forced.returncode != 0 and "FAIL  redis       authentication failed" in forced.stdout
        assert "rediss://causeway:***@127.0.0.1" in shown.stdout
        config = outputs[0]
        assert "kafka_sasl_password      Secret('***')" in config
        letters = await pipe.dead_letters()
        outputs += [repr(dl.headers()) + repr(dl.detail) for dl in letters]
        metrics = (await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{worker.port}/metrics", timeout=10)).text
        outputs.append(metrics)
    finally:
        pipe.stop_all()
    outputs += [w.log.read_text() for w in pipe.workers]
    assert sum(len(o) for o in outputs) > 10_000  # debug logs were really captured
    leaked = {s[:4] + "…" for s in secured.secrets for text in outputs if s in text}
    assert not leaked, f"secrets leaked (prefixes): {leaked}"


async def test_cdc_ingest_over_sasl_ssl(secured: SecureStack, unique: str) -> None:
    """The CDC ingest's consumer and producer use the secured options: a Debezium record becomes an event."""
    import orjson
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from agents.cdc import CdcIngest, IngestOptions
    from agents.cdc_mapping import load_mapping
    from streams.security import kafka_client_options
    from streams.settings import Settings
    from tests.integration.cdc_records import order_record

    s = Settings.from_env().replace(
        objects_topic=f"objs.{unique}", links_topic=f"links.{unique}", dlq_topic=f"dlq.{unique}", app_id=f"cw-{unique}"
    )
    raw = f"cdc.raw.{unique}.orders"
    mapping = load_mapping({"tables": [{"topic": raw, "world": "prod", "object_type": "Order", "pk": "id"}]})
    options = IngestOptions(pattern=rf"^cdc\.raw\.{unique}\..*", metadata_max_age_ms=1000, poll_timeout_ms=200)
    opts = kafka_client_options(s)
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, acks="all", **opts)
    await producer.start()
    try:
        for i in range(5):
            key, value = order_record("c", i, 700 + i)
            await producer.send_and_wait(raw, value, key=key)
    finally:
        await producer.stop()
    ingest = CdcIngest(s, mapping, options)
    await ingest.start()
    task = asyncio.create_task(ingest.run())
    consumer = AIOKafkaConsumer(
        s.objects_topic, bootstrap_servers=s.kafka_bootstrap, auto_offset_reset="earliest", **opts
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 90
        while len(got) < 5 and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got += [r.value for r in records]
    finally:
        await consumer.stop()
        ingest.stop_soon()
        await asyncio.wait_for(task, 30)
        await ingest.stop()
    assert len(got) == 5
    assert {orjson.loads(v)["world_id"] for v in got} == {"prod"}


def test_worker_with_a_wrong_kafka_password_stops_with_one_line(stack: SecureStack, unique: str) -> None:
    """Not a hang, not a traceback: the worker exits non-zero naming the authentication failure."""
    env = os.environ | stack.env | {"CAUSEWAY_KAFKA_SASL_PASSWORD": BAD, "CAUSEWAY_APP_ID": f"cw-{unique}"}
    done = causeway(env, "worker", "--web-port", str(free_port()), timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stdout + done.stderr
    assert "authentication failed" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert BAD not in done.stdout + done.stderr
