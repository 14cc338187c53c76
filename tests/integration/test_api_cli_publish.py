"""`causeway publish ...` over the API (`CAUSEWAY_API_URL` set) against a real `causeway serve`: the same
output, `--json` and exit codes as the same command run on Nessie directly, every subcommand."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from bench.api_load import ApiProcess
from bench.procs import worker_env
from cli.main import cli
from tests.integration import api_fixtures as afx
from tests.integration import api_merge_fixtures as amf
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import obj
from tests.integration.worlds_fixtures import fork
from worlds.api import Worlds
from worlds.publish_run import Publisher

pytestmark = pytest.mark.integration
world_settings, wclient, written, api = fx.world_settings, fx.wclient, fx.written, fx.api
api_settings = afx.api_settings
server, pair = amf.server, amf.pair
STALE = re.compile(r"stale \d+s")


def _envs(server: ApiProcess, role: str = "operator") -> tuple[dict[str, str], dict[str, str]]:
    local = worker_env(server.settings)
    return local, local | {"CAUSEWAY_API_URL": server.target, "CAUSEWAY_API_TOKEN": server.tokens[role]}


def _run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def _both(local: dict[str, str], remote: dict[str, str], *args: str, code: int = 0) -> tuple[Result, Result]:
    a, b = _run(local, *args), _run(remote, *args)
    assert (a.exit_code, b.exit_code) == (code, code), (a.output, b.output)
    assert "Traceback" not in a.output + b.output
    return a, b


def _same(local: dict[str, str], remote: dict[str, str], *args: str, code: int = 0) -> Result:
    """The same exit code, stdout and (on an error) the same one error line both ways."""
    a, b = _both(local, remote, *args, code=code)
    assert b.stdout == a.stdout
    if code == 1:
        assert b.stderr == a.stderr
    return b


def _doc(out: str) -> Any:
    return orjson.loads(out.splitlines()[0])


def _but(doc: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in keys}


def test_every_publish_command_goes_through_the_api(pair, api: Worlds, server: ApiProcess) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl"), obj(s, "p9", "CREATE", 1, name="new")])
    local, remote = _envs(server)
    reader = _envs(server, "reader")[1]
    log = Publisher(api, log_branch=server.settings.publish_log_branch).log

    # audit: the same report and exit code (0 eligible, 12 blocked by entities); the JSON record but
    # its time and auditor (over the API the server records the token's name)
    _same(local, remote, "publish", "audit", s, "--into", t)
    _same(local, remote, "publish", "audit", s, "--into", t, "--max-changed-entities", "0", code=12)
    a, b = _both(local, remote, "publish", "audit", s, "--into", t, "--json", "--by", "ana")
    rec = _doc(b.stdout)
    assert _but(_doc(a.stdout), "at", "by") == _but(rec, "at", "by") and rec["verdict"] == "eligible"
    pid = rec["plan_id"]
    audits = [e for e in log.entries(pid) if e["kind"] == "audit"]
    assert [e["record"]["by"] for e in audits[-2:]] == ["ana", "test-operator"]
    bad = _both(local, remote, "publish", "audit", s, "--into", t, "--max-tables", "0", code=1)
    assert all("thresholds: --max-drift must be >= 0" in r.stderr for r in bad)  # over the API: INVALID_ARGUMENT
    assert "INVALID_ARGUMENT" in bad[1].stderr

    # approve and run of an unknown plan: the same error line
    _same(local, remote, "publish", "approve", "pl-0000000000000000", "--by", "x", code=1)
    _same(local, remote, "publish", "run", "pl-0000000000000000", code=1)
    # a run before the approval is refused: exit 5 both ways, dry run or not
    _same(local, remote, "publish", "run", pid, code=5)
    _same(local, remote, "publish", "run", pid, "--execute", code=5)
    _same(local, remote, "publish", "run", pid, "--execute", "--json", code=5)

    denied = _run(reader, "publish", "approve", pid, "--by", "test-reader")
    assert denied.exit_code == 1 and "PERMISSION_DENIED" in denied.output, denied.output
    _same(local, remote, "publish", "approve", pid, "--by", "test-operator")  # the token's name is recorded
    assert log.entries(pid)[-1]["by"] == "test-operator"
    _same(local, remote, "publish", "run", pid)  # a dry run: would fast-forward
    _same(local, remote, "publish", "run", pid, "--json")

    done = _run(remote, "publish", "run", pid, "--execute", "--json")
    assert done.exit_code == 0, done.output
    out = _doc(done.stdout)
    assert (out["outcome"], out["path"], out["verified"], out["source_deleted"]) == (
        "published",
        "fast-forward",
        True,
        True,
    )
    assert api.head(t).hash == rec["source_hash"] == out["commit"]
    again = _same(local, remote, "publish", "run", pid, "--execute", "--json")  # the first run's result
    assert _doc(again.stdout)["action"] == "done" and _doc(again.stdout)["commit"] == out["commit"]
    runs = [e for e in log.entries(pid) if e["kind"] == "run" and e["outcome"] == "published"]
    assert [r["by"] for r in runs] == ["test-operator"]  # published once

    # status: the same rows but the staleness, which moves with the clock
    a, b = _both(local, remote, "publish", "status")
    assert STALE.sub("stale Ns", a.stdout) == STALE.sub("stale Ns", b.stdout) and s in b.stdout
    a, b = _both(local, remote, "publish", "status", "--json")
    rows = [_but(r, "staleness_seconds") for r in _doc(b.stdout)]
    assert [_but(r, "staleness_seconds") for r in _doc(a.stdout)] == rows
    assert {"source": s, "plan_id": pid, "outcome": "published"}.items() <= next(
        r for r in rows if r["source"] == s
    ).items()
    assert _run(reader, "publish", "status").exit_code == 0  # a read: reader is enough

    calls = {(e["who"], e["method"], e["result"]) for e in server.audit()}
    for method in ("PublishAudit", "PublishApprove", "PublishRun"):
        assert ("test-operator", method, "OK") in calls
    assert ("test-operator", "PublishRun", "FAILED_PRECONDITION") in calls
    assert ("test-reader", "PublishApprove", "PERMISSION_DENIED") in calls


def test_publish_run_by_merge_and_a_declined_plan_through_the_api(pair, api: Worlds, server: ApiProcess) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="etl")])
    target.commit("t1", [obj(t, "p4", "UPDATE", 2, name="prod")])
    other = fork(target, api, f"{t}-other")
    other.commit("o1", [obj(other.world, "p2", "UPDATE", 3, name="other")])
    local, remote = _envs(server)
    pid = _doc(_run(remote, "publish", "audit", s, "--into", t, "--json").stdout)["plan_id"]
    declined = _doc(_run(remote, "publish", "audit", other.world, "--into", t, "--json").stdout)["plan_id"]
    _same(local, remote, "publish", "approve", declined, "--by", "test-operator", "--decline")
    _same(local, remote, "publish", "run", declined, "--execute", code=5)  # declined by the approver

    assert _run(remote, "publish", "approve", pid, "--by", "test-operator").exit_code == 0
    merged = _run(remote, "publish", "run", pid, "--execute", "--keep-source")
    assert merged.exit_code == 0 and merged.stdout.startswith("published: published by merge"), merged.output
    assert _doc(_run(local, "publish", "run", pid, "--execute", "--json").stdout)["path"] == "merge"
    assert api.head(s).hash  # kept
