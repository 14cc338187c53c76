"""The pipeline against a secured stack it starts itself (scripts/services.sh --secure).

Kafka speaks only SASL_SSL with SCRAM, Redis only TLS with a password, Nessie sits behind a token
proxy over HTTPS. The stack runs on free ports in a temporary run dir beside the plain services
(whose Nessie the proxy forwards to) and is stopped at the end of the module. These tests carry the
``secured`` marker: ``-m "not secured"`` skips them in a fast run; the full suite runs them.
"""

from __future__ import annotations

import asyncio
import base64
import json
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

pytestmark = [pytest.mark.integration, pytest.mark.secured, pytest.mark.slow]


@dataclass
class SecureStack:
    env: dict[str, str]  # the CAUSEWAY_* settings of a client of the secured stack
    secrets: list[str]  # every secret value the stack generated
    run_dir: Path
    extra: dict[str, str]  # CAUSEWAY_SECURE_*: the mutual-TLS listener and client certificate

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
        "CAUSEWAY_SECURE_KAFKA_MTLS_PORT": str(free_port()),
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
        exported = dict(
            line.removeprefix("export ").split("=", 1) for line in printed.splitlines() if line.startswith("export ")
        )
        client_env = {k: v for k, v in exported.items() if not k.startswith("CAUSEWAY_SECURE_")}
        extra = {k: v for k, v in exported.items() if k.startswith("CAUSEWAY_SECURE_")}
        values = [
            line.split("=", 1)[1]
            for line in (run_dir / "secrets.env").read_text().splitlines()
            if line.split("=", 1)[0].endswith(("PASSWORD", "TOKEN", "SECRET"))
        ]
        yield SecureStack(client_env, values, run_dir, extra)
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
    from aiokafka.errors import GroupCoordinatorNotAvailableError

    from streams.lag_probe import OffsetProbe
    from streams.security import kafka_client_options

    s = pipe.settings
    probe = OffsetProbe(s.kafka_bootstrap, kafka_options=kafka_client_options(s))
    try:
        parts = await probe.partitions([s.objects_topic, s.links_topic])
        for _ in range(30):  # a fresh broker creates its offsets topic at the first coordinator lookup
            try:
                rows = await probe.offsets(s.app_id, parts)
                break
            except GroupCoordinatorNotAvailableError:
                await asyncio.sleep(1)
        else:
            raise AssertionError("no group coordinator in 30 s")
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


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"CAUSEWAY_KAFKA_SASL_PASSWORD": BAD}, "authentication failed"),
        ({"CAUSEWAY_KAFKA_SSL_CA_FILE": ""}, "certificate is not trusted"),
        ({"CAUSEWAY_REDIS_PASSWORD": BAD}, "authentication failed"),
        ({"CAUSEWAY_NESSIE_OAUTH_CLIENT_SECRET": BAD}, "refused the client id or secret"),
        ({"CAUSEWAY_NESSIE_OAUTH_TOKEN_URL": "", "CAUSEWAY_NESSIE_TOKEN": BAD}, "Nessie refused the credentials"),
    ],
    ids=[
        "kafka-wrong-password",
        "kafka-untrusted-cert",
        "redis-wrong-password",
        "nessie-wrong-secret",
        "nessie-wrong-token",
    ],
)
async def test_worker_with_refused_credentials_stops_and_loses_nothing(
    secured: SecureStack, unique: str, tmp_path: Path, change: dict[str, str], reason: str
) -> None:
    """A worker whose password, certificate or token is refused exits at start with one line; nothing is
    applied or acked.

    The same events are then applied in full by a worker with the right credentials.
    """
    pipe = await Pipeline.create(unique, tmp_path)
    try:
        wl = generate(pipe.params(events=200, worlds=1, keys=10, seed=9, bad_rate=0.0))
        await pipe.publish(wl.records)
        good_env = pipe.env
        pipe.env = good_env | change
        bad = pipe.start_worker(wait=False)
        code = await asyncio.to_thread(bad.proc.wait, 120)  # not left running: it ends on its own
        log = bad.log.read_text()
        assert code != 0, log
        errors = [line for line in log.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "Traceback" not in log, log
        assert reason in errors[0], errors[0]
        assert "is not Nessie" not in errors[0] and "something else answers" not in errors[0], errors[0]
        assert await committed(pipe) == 0, "offsets were committed without a Nessie commit"
        assert not pipe.state("prod").event_ids, "events applied with refused credentials"
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

    from agents.cdc import CdcIngest
    from cdc.mapping_loader import load_mapping
    from streams.security import kafka_client_options
    from streams.settings import Settings
    from tests.integration.cdc_records import order_record

    s = Settings.from_env().replace(
        objects_topic=f"objs.{unique}",
        links_topic=f"links.{unique}",
        dlq_topic=f"dlq.{unique}",
        app_id=f"cw-{unique}",
        cdc_pattern=rf"^cdc\.raw\.{unique}\..*",
        cdc_metadata_max_age_ms=1000,
        cdc_poll_timeout_ms=200,
    )
    raw = f"cdc.raw.{unique}.orders"
    mapping = load_mapping({"tables": [{"topic": raw, "world": "prod", "object_type": "Order", "pk": "id"}]})
    opts = kafka_client_options(s)
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, acks="all", **opts)
    await producer.start()
    try:
        for i in range(5):
            key, value = order_record("c", i, 700 + i)
            await producer.send_and_wait(raw, value, key=key)
    finally:
        await producer.stop()
    ingest = CdcIngest(s, mapping)
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


# ------------------------------------------------------------------ each SASL mechanism, and mutual TLS
def unsecured_jws(sub: str, lifetime_s: float) -> str:
    """An unsigned token Kafka's unsecured-JWS validator accepts while ``exp`` is ahead (test brokers only)."""

    def part(doc: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    now = int(time.time())
    return f"{part({'alg': 'none'})}.{part({'sub': sub, 'iat': now, 'exp': now + int(lifetime_s)})}."


def kafka_mode(stack: SecureStack, mode: str, tmp_path: Path) -> dict[str, str]:
    """Client settings for one way of authenticating to the secured broker."""
    if mode == "PLAIN":
        return {"CAUSEWAY_KAFKA_SASL_MECHANISM": "PLAIN"}
    if mode == "OAUTHBEARER":
        # A token command that logs each call: a fresh token per authentication (refresh interval 0).
        script = tmp_path / "token.py"
        calls = tmp_path / "token-calls"
        script.write_text(
            "import base64, json, time\n"
            "def part(doc): return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b'=').decode()\n"
            f"open({str(calls)!r}, 'a').write('x')\n"
            "now = int(time.time())\n"
            "print(part({'alg': 'none'}) + '.' + part({'sub': 'causeway', 'iat': now, 'exp': now + 600}) + '.')\n"
        )
        return {
            "CAUSEWAY_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
            "CAUSEWAY_KAFKA_OAUTH_TOKEN_COMMAND": f"{sys.executable} {script}",
            "CAUSEWAY_KAFKA_OAUTH_REFRESH_S": "0",
        }
    assert mode == "mTLS"
    return {
        "CAUSEWAY_KAFKA_BOOTSTRAP": stack.extra["CAUSEWAY_SECURE_KAFKA_MTLS_BOOTSTRAP"],
        "CAUSEWAY_KAFKA_SECURITY_PROTOCOL": "SSL",
        "CAUSEWAY_KAFKA_SSL_CERT_FILE": stack.extra["CAUSEWAY_SECURE_CLIENT_CERT"],
        "CAUSEWAY_KAFKA_SSL_KEY_FILE": stack.extra["CAUSEWAY_SECURE_CLIENT_KEY"],
        "CAUSEWAY_KAFKA_SSL_KEY_PASSWORD": stack.extra["CAUSEWAY_SECURE_CLIENT_KEY_PASSWORD"],
    }


@pytest.mark.parametrize(
    ("mode", "shown"),
    [
        ("PLAIN", "SASL_SSL, PLAIN user causeway"),
        ("OAUTHBEARER", "SASL_SSL, OAUTHBEARER"),
        ("mTLS", "client certificate"),
    ],
)
async def test_pipeline_with_each_kafka_authentication(
    secured: SecureStack, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, shown: str
) -> None:
    """PLAIN, OAUTHBEARER (token from a command, fetched again at each authentication) and mutual TLS
    against the real broker, through causeway's own client factory: the worker (Faust and its intake),
    the publisher, the dead-letter reader and doctor."""
    for name, value in kafka_mode(secured, mode, tmp_path).items():
        monkeypatch.setenv(name, value)
    pipe = await Pipeline.create(unique, tmp_path)
    try:
        wl = generate(pipe.params(events=120, worlds=1, keys=10, seed=4, bad_rate=0.05))
        pipe.start_worker()
        await pipe.publish(wl.records)
        await pipe.wait_drained(timeout=240)
        assert_matches_model(pipe, wl.valid_events)
        assert len(await pipe.dead_letters()) == wl.bad_count > 0
        doctor = causeway(pipe.env, "doctor")
        line = next(x for x in doctor.stdout.splitlines() if x.split()[1:2] == ["kafka"])
        assert line.lstrip().startswith("ok") and shown in line, doctor.stdout
    finally:
        pipe.stop_all()
    if mode == "OAUTHBEARER":
        calls = len((tmp_path / "token-calls").read_text())
        assert calls >= 3, f"the token command ran {calls} time(s): tokens are not fetched again"
    logs = "".join(w.log.read_text() for w in pipe.workers) + doctor.stdout + doctor.stderr
    assert not [s for s in secured.secrets if s in logs]


async def test_oauthbearer_expired_token_is_refused_and_a_rotated_file_accepted(
    stack: SecureStack, tmp_path: Path
) -> None:
    """An expired token ends in one clear line (not an unrelated error); the rewritten file is read again."""
    from aiokafka import AIOKafkaProducer

    from streams.security import KafkaFailureLog, explain_failure, kafka_client_options
    from streams.settings import Settings

    token_file = tmp_path / "kafka-token"
    token_file.write_text(unsecured_jws("causeway", -60))
    env = stack.env | {
        "CAUSEWAY_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
        "CAUSEWAY_KAFKA_OAUTH_TOKEN_FILE": str(token_file),
        "CAUSEWAY_KAFKA_OAUTH_REFRESH_S": "0",
    }
    doctor = causeway(os.environ | env, "doctor")
    line = next(x for x in doctor.stdout.splitlines() if x.split()[:2] == ["FAIL", "kafka"])
    assert "refused the OAUTHBEARER token" in line, doctor.stdout

    settings = Settings.from_env(env)
    options = kafka_client_options(settings)  # one token source for both producers
    refused = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=20_000, **options)
    with KafkaFailureLog() as kafka_log:
        with pytest.raises(Exception) as failed:  # noqa: PT011 - aiokafka raises its generic KafkaConnectionError
            await refused.start()
    await refused.stop()
    assert "refused the OAUTHBEARER token" in explain_failure(failed.value, settings, kafka_log.last)

    token_file.write_text(unsecured_jws("causeway", 600))  # a sidecar rotates the token
    accepted = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, **options)
    await accepted.start()
    try:
        sent = await accepted.send_and_wait(f"sec.rotated.{secrets.token_hex(4)}", b"x")
        assert sent.offset == 0
    finally:
        await accepted.stop()


def test_mutual_tls_without_a_client_certificate_is_refused_in_one_line(stack: SecureStack, tmp_path: Path) -> None:
    env = os.environ | stack.env | kafka_mode(stack, "mTLS", tmp_path)
    for name in ("CAUSEWAY_KAFKA_SSL_CERT_FILE", "CAUSEWAY_KAFKA_SSL_KEY_FILE", "CAUSEWAY_KAFKA_SSL_KEY_PASSWORD"):
        env.pop(name)
    done = causeway(env, "doctor")
    line = next(x for x in done.stdout.splitlines() if x.split()[:2] == ["FAIL", "kafka"])
    assert "client certificate" in line, done.stdout
    wrong_key = causeway(
        os.environ | stack.env | kafka_mode(stack, "mTLS", tmp_path) | {"CAUSEWAY_KAFKA_SSL_KEY_PASSWORD": BAD},
        "doctor",
    )
    assert wrong_key.returncode != 0 and "Traceback" not in wrong_key.stdout + wrong_key.stderr
    assert "cannot load TLS files" in wrong_key.stdout + wrong_key.stderr, wrong_key.stdout + wrong_key.stderr
    assert BAD not in wrong_key.stdout + wrong_key.stderr


@pytest.mark.timeout(600)
def test_benchmark_runs_secured_and_writes_no_secret(
    secured: SecureStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark (causeway, naive and ceiling contenders) over the secured stack, the Redis password
    inside the URL: the run completes, and no file it wrote (results, contender configs, logs) holds a secret."""
    from bench.__main__ import main
    from bench.profiles import CONTENDERS

    url = secured.env["CAUSEWAY_REDIS_URL"].replace(
        "rediss://", f"rediss://causeway:{secured.env['CAUSEWAY_REDIS_PASSWORD']}@"
    )
    monkeypatch.setenv("CAUSEWAY_REDIS_URL", url)
    monkeypatch.delenv("CAUSEWAY_REDIS_PASSWORD")
    assert main(["run", "--profile", "tiny", "--out", str(tmp_path)]) == 0
    [result] = tmp_path.glob("*.json")
    doc = json.loads(result.read_text())
    assert set(doc["contenders"]) == set(CONTENDERS)
    assert all(fig["nessie_commits"] > 0 for fig in doc["contenders"].values())
    work = Path(doc["run"]["work_dir"])
    configs = list(work.glob("naive-*.json"))
    assert configs and "causeway:***@" in configs[0].read_text()
    files = [p for p in [*tmp_path.iterdir(), *work.rglob("*")] if p.is_file()]
    leaked = {f"{p.name}: {s[:4]}…" for p in files for s in secured.secrets if s in p.read_text(errors="replace")}
    assert not leaked, leaked


async def test_schema_sync_over_sasl_ssl(secured: SecureStack, unique: str, tmp_path: Path) -> None:
    """Schema sync's consumer, answer producer and Nessie commits use the secured options: a change is applied."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    from agents.schema_sync import SchemaSync
    from models.schema import StorageSchemaUpdated
    from monitoring.metrics import Metrics
    from sinks.nessie import Reference, SyncNessieClient
    from streams.security import kafka_client_options
    from streams.settings import Settings
    from tests.factories import schema_change

    s = Settings.from_env().replace(
        warehouse=f"file://{tmp_path}/warehouse",
        app_id=f"cw-{unique}",
        schema_topic=f"schema.{unique}",
        schema_answer_topic=f"schema-answer.{unique}",
        schema_intelligence_topic=f"schema-intel.{unique}",
        dlq_topic=f"dlq.{unique}",
    )
    world = f"t{unique}"
    with SyncNessieClient.from_settings(s) as client:
        client.create_branch(f"world-{world}", Reference("main", "BRANCH", client.config().no_ancestor_hash))
    opts = kafka_client_options(s)
    sync = SchemaSync(s, Metrics(), poll_timeout_ms=100)
    await sync.start()
    task = asyncio.create_task(sync.run())
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, **opts)
    consumer = AIOKafkaConsumer(bootstrap_servers=s.kafka_bootstrap, enable_auto_commit=False, **opts)
    try:
        await producer.start()
        add = {"op": "add", "id": "lvl", "name": "level", "type": "long"}
        await producer.send_and_wait(s.schema_topic, schema_change(world, 1, add), key=world.encode())
        await consumer.start()
        tp = TopicPartition(s.schema_answer_topic, 0)  # created by sync.start()
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        answers: list[StorageSchemaUpdated] = []
        deadline = time.monotonic() + 120
        while not answers and time.monotonic() < deadline:
            for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                answers += [StorageSchemaUpdated.decode(r.value) for r in records]
    finally:
        await producer.stop()
        await consumer.stop()
        await sync.stop()
        task.cancel()
    assert [(a.requested_version, a.status) for a in answers] == [(1, "applied")], answers


def test_reconcile_dry_run_over_the_secured_stack(stack: SecureStack, unique: str) -> None:
    """Reconciliation's control-count reader (Kafka) and branch reads (Nessie proxy) work secured."""
    env = (
        os.environ
        | stack.env
        | {"CAUSEWAY_CONTROL_COUNTS_TOPIC": f"counts.{unique}", "CAUSEWAY_APP_ID": f"cw-{unique}"}
    )
    done = causeway(env, "reconcile", "--world", "prod", "--dry-run")
    assert done.returncode in (0, 3), done.stdout + done.stderr  # 3: the shared main branch differs
    assert "reconcile (dry run)" in done.stdout and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert not [s for s in stack.secrets if s in done.stdout + done.stderr]
