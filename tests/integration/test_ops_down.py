"""Every command with a service's URL pointed at a closed port, or at another service: it fails in a
bounded time with one line naming the service and its URL (credentials masked), exit 4, no traceback.

The bound is ``cli.preflight.PREFLIGHT_TIMEOUT_S`` (5 s: the probes run concurrently) plus the
interpreter's start-up; ``BOUND_S`` allows for a loaded 2-core machine and is far below the hang it
guards against (``replay`` with Nessie down used to run until killed).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from cli.errors import Exit
from cli.main import needs
from cli.preflight import PREFLIGHT_TIMEOUT_S
from streams.settings import Settings
from tests.integration.pipeline import ROOT

pytestmark = pytest.mark.integration

BOUND_S = PREFLIGHT_TIMEOUT_S + 15.0
W = "opsdown-w"
COMMANDS: list[tuple[str, ...]] = [
    ("worlds", "list"),
    ("worlds", "create", W, "--dry-run"),
    ("worlds", "delete", W, "--yes"),
    ("replay", "--dry-run"),
    ("replay", "--world", W, "--wait-parked", "0"),
    ("dlq", "list"),
    ("dlq", "show", "0:1"),
    ("dlq", "redrive", "--all", "--dry-run"),
    ("offsets", "show"),
    ("offsets", "reset", "--to", "earliest", "--dry-run"),
    ("rebuild", W, "--dry-run"),
    ("reconcile", "--world", W, "--dry-run"),
    ("worker",),
    ("demo", "--events", "10"),
]
SETTING = {"kafka": "CAUSEWAY_KAFKA_BOOTSTRAP", "redis": "CAUSEWAY_REDIS_URL", "nessie": "CAUSEWAY_NESSIE_URL"}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_url(service: str, port: int) -> str:
    return {
        "kafka": f"127.0.0.1:{port}",
        "redis": f"redis://:hunter2@127.0.0.1:{port}/0",
        "nessie": f"http://127.0.0.1:{port}/api/v2",
    }[service]


def run(args: tuple[str, ...], **env: str) -> tuple[int | None, str, str, float]:
    unique = f"down{os.getpid()}"
    full = (
        os.environ
        | {
            "CAUSEWAY_OBJECTS_TOPIC": f"objs.{unique}",
            "CAUSEWAY_LINKS_TOPIC": f"links.{unique}",
            "CAUSEWAY_DLQ_TOPIC": f"dlq.{unique}",
            "CAUSEWAY_APP_ID": f"cw-{unique}",
            "CAUSEWAY_MAIN_BRANCH": f"main-{unique}",
        }
        | env
    )
    started = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=90
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return None, out, "", time.monotonic() - started
    return p.returncode, p.stdout, p.stderr, time.monotonic() - started


def cases() -> list[tuple[str, tuple[str, ...]]]:
    return [(s, c) for s in ("kafka", "redis", "nessie") for c in COMMANDS if s in needs(c[:2])]


@pytest.mark.parametrize(("service", "command"), cases(), ids=lambda v: v if isinstance(v, str) else "-".join(v[:2]))
def test_a_command_with_a_service_down_fails_fast_with_one_line(service: str, command: tuple[str, ...]) -> None:
    url = closed_url(service, closed_port())
    code, out, err, took = run(command, **{SETTING[service]: url})
    assert took < BOUND_S, f"{' '.join(command)} took {took:.1f}s with {service} down"
    assert code == Exit.UNAVAILABLE, (code, out, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    masked = url.replace("hunter2", "***")
    assert lines[0].startswith("Error: ") and masked in lines[0] and "hunter2" not in lines[0]
    assert SETTING[service] in lines[0] and "running" in lines[0]


@pytest.mark.parametrize("command", [c for c in COMMANDS if "nessie" in needs(c[:2])], ids=lambda c: "-".join(c[:2]))
def test_a_url_that_is_not_nessie_is_never_a_missing_world(command: tuple[str, ...]) -> None:
    # Prometheus answers 404 pages on any path: reachable, but not Nessie.
    not_nessie = Settings.from_env().prometheus_url.rstrip("/") + "/api/v2"
    code, out, err, took = run(command, CAUSEWAY_NESSIE_URL=not_nessie)
    assert took < BOUND_S
    assert code == Exit.UNAVAILABLE, (code, out, err)
    assert "Traceback" not in out + err
    assert "is not Nessie" in err and "CAUSEWAY_NESSIE_URL" in err
    assert "does not exist" not in out + err and "nothing to do" not in out + err


@pytest.mark.parametrize("service", ["kafka", "redis", "nessie"])
def test_doctor_tells_not_running_from_not_that_service(service: str) -> None:
    code, out, err, took = run(("doctor",), **{SETTING[service]: closed_url(service, closed_port())})
    assert took < BOUND_S and code == Exit.UNAVAILABLE and "Traceback" not in out + err
    assert any(line.split()[:2] == ["DOWN", service] for line in out.splitlines()), out
    if service == "nessie":
        prom = Settings.from_env().prometheus_url.rstrip("/") + "/api/v2"
        code, out, err, _ = run(("doctor",), CAUSEWAY_NESSIE_URL=prom)
        assert code == Exit.UNAVAILABLE
        assert any(line.split()[:2] == ["WRONG", "nessie"] for line in out.splitlines()), out


def test_config_refuses_a_malformed_url() -> None:
    code, out, err, _ = run(("config",), CAUSEWAY_NESSIE_URL="localhost:19120")
    assert code == Exit.USAGE and "Traceback" not in err
    assert err.strip().splitlines() == [
        "Error: CAUSEWAY_NESSIE_URL='localhost:19120' is not a URL: use http://host:port..."
    ]


@pytest.mark.parametrize(
    ("command", "code", "words"),
    [
        (("worlds", "create", "Bad World"), Exit.ERROR, "invalid world id"),
        (("worlds", "delete", "Bad World", "--yes"), Exit.ERROR, "invalid world id"),
        (("rebuild", "nosuch-opsdown", "--dry-run"), Exit.ERROR, "has no branch"),
        (("rebuild", "Bad World", "--dry-run"), Exit.ERROR, "invalid world id"),
        (("replay", "--into-world", "Bad World", "--dry-run"), Exit.USAGE, "invalid world id"),
        (("dlq", "show", "99:99"), Exit.ERROR, "no dead letter"),
        (("offsets", "show", "--topic", "nosuch.opsdown"), Exit.ERROR, "does not exist"),
        (("reconcile", "--world", "Bad World", "--dry-run"), None, "invalid world id"),
    ],
    ids=lambda v: "-".join(v[:2]) if isinstance(v, tuple) else None,
)
def test_an_unknown_world_or_bad_id_is_one_line_never_a_traceback(
    command: tuple[str, ...], code: Exit | None, words: str
) -> None:
    """Issue 19 item 5 across the commands, with every service up."""
    got, out, err, _ = run(command)
    assert got != 0 and (code is None or got == code), (got, out, err)
    assert "Traceback" not in out + err
    assert words in (out + err)
    assert len([line for line in err.splitlines() if line.startswith("Error:")]) <= 1
