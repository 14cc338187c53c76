"""The CLI's world commands over the API (`CAUSEWAY_API_URL` set) against a real `causeway serve`:
the same output, `--json` and exit codes as the same command run against Nessie directly."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from bench.api_load import ApiProcess
from bench.procs import worker_env
from cli.main import cli
from sinks import committer
from tests.integration import api_fixtures as afx
from tests.integration import api_merge_fixtures as amf
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import obj
from tests.integration.worlds_fixtures import WrittenWorld

pytestmark = pytest.mark.integration
world_settings, wclient, written, api = fx.world_settings, fx.wclient, fx.written, fx.api
api_settings = afx.api_settings
server, pair = amf.server, amf.pair
NOW = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\) ---$", re.M)  # cli.summary.now() in a summary title


def _envs(server: ApiProcess, role: str = "operator") -> tuple[dict[str, str], dict[str, str]]:
    """(local, remote): the server's own settings, without and with the API's URL and a token."""
    local = worker_env(server.settings)
    return local, local | {"CAUSEWAY_API_URL": server.target, "CAUSEWAY_API_TOKEN": server.tokens[role]}


def _run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def _same(local: dict[str, str], remote: dict[str, str], *args: str, code: int = 0) -> Result:
    """Run a command both ways: the same exit code and the same output (stdout, but the time a summary
    title shows; stderr holds a progress bar that shows rates)."""
    a, b = _run(local, *args), _run(remote, *args)
    assert (a.exit_code, b.exit_code) == (code, code), (a.output, b.output)
    assert NOW.sub("NOW", b.stdout) == NOW.sub("NOW", a.stdout)
    if code:
        assert b.stderr == a.stderr  # the one error line
    return b


def _lines(out: str) -> list[Any]:
    return [orjson.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_merge_and_conflict_commands_go_through_the_api(pair, server: ApiProcess) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="src1"), obj(s, "p2", "UPDATE", 2, name="src2")])
    source.commit("s2", [obj(s, "p9", "CREATE", 1, name="new")])
    target.commit("t1", [obj(t, "p1", "UPDATE", 2, name="tgt1"), obj(t, "p2", "UPDATE", 2, name="tgt2")])
    local, remote = _envs(server)

    # a dry run: the same text; the same JSON but the seconds it took
    _same(local, remote, "worlds", "merge", s, "--into", t, "--dry-run")
    dry = ("worlds", "merge", s, "--into", t, "--dry-run", "--json")
    a, b = (_lines(_run(env, *dry).output) for env in (local, remote))
    assert [{k: v for k, v in d.items() if k != "seconds"} for d in a] == [
        {k: v for k, v in d.items() if k != "seconds"} for d in b
    ]
    assert b[0]["status"] == "conflicts" and len(b[0]["conflict_list"]) == 2
    # NORMAL refuses on conflicts (ABORTED over the API): both print the conflicts and exit 1
    refused = _same(local, remote, "worlds", "merge", s, "--into", t, code=1)
    assert "! MODIFY_MODIFY" in refused.output and "not merged: conflicts" in refused.output
    # a strategy the proto's enum does not name travels by name
    field = _run(remote, "worlds", "merge", s, "--into", t, "--strategy", "FIELD_LEVEL+THEIRS", "--dry-run", "--json")
    assert field.exit_code == 0, field.output
    assert _lines(field.output)[0]["strategy"]["default"] == "FIELD_LEVEL+SOURCE_WINS"

    # MANUAL over the API leaves a pending merge both paths list the same way
    pending = _run(remote, "worlds", "merge", s, "--into", t, "--strategy", "MANUAL")
    assert pending.exit_code == 1 and "MANUAL merge pending" in pending.output, pending.output
    _same(local, remote, "worlds", "conflicts", "list", t)
    _same(local, remote, "worlds", "conflicts", "list", t, "--json")
    _same(local, remote, "worlds", "conflicts", "show", t, "1")
    _same(local, remote, "worlds", "conflicts", "show", t, "7", code=1)
    reader = _envs(server, "reader")[1]
    denied = _run(reader, "worlds", "conflicts", "resolve", t, "1", "--take", "source")
    assert denied.exit_code == 1 and "PERMISSION_DENIED" in denied.output and "Traceback" not in denied.output
    for cid, take in (("1", "source"), ("2", 'value={"name": "chosen"}')):
        done = _run(remote, "worlds", "conflicts", "resolve", t, cid, "--take", take)
        assert done.exit_code == 0 and done.output.rstrip().endswith(f"-> {take}"), done.output
    _same(local, remote, "worlds", "conflicts", "list", t)
    merged = _run(remote, "worlds", "merge", "--continue", "--into", t, "--json")
    assert merged.exit_code == 0, merged.output
    doc = _lines(merged.output)[0]
    with server.client("reader") as r:
        assert doc["status"] == "merged" and doc["commit"] == r.get_world(t).head_hash
    listed = _run(remote, "worlds", "conflicts", "list", t)  # finished: nothing pending
    assert listed.exit_code == 1 and "NOT_FOUND" in listed.output
    calls = [(e["who"], e["method"]) for e in server.audit() if e["world"] == t and e["result"] == "OK"]
    assert [m for w, m in calls if w == "test-operator"].count("ResolveConflict") == 2
    assert ("test-operator", "ContinueMerge") in calls and ("test-operator", "MergeWorld") in calls


def test_history_and_release_commands_go_through_the_api(written: WrittenWorld, server: ApiProcess) -> None:
    w = written.world
    first = written.commit("b1", [obj(w, "p1", "CREATE", 1, name="a")])
    written.commit("b2", [obj(w, "p1", "UPDATE", 2, name="b"), obj(w, "p2", "CREATE", 1, name="c")])
    local, remote = _envs(server)
    made = _run(remote, "worlds", "release", "create", w, "r1", "-m", "first", "--json")
    assert made.exit_code == 0 and _lines(made.output)[0]["created"] is True, made.output
    again = _run(remote, "worlds", "release", "create", w, "r1", "-m", "first")
    assert again.exit_code == 0 and again.output.startswith("already exists: "), again.output
    assert any(e["method"] == "CreateRelease" and e["world"] == w for e in server.audit())

    for args in (
        ("worlds", "history", w),
        ("worlds", "history", w, "--json"),
        ("worlds", "history", w, "--limit", "2", "--no-counts"),
        ("worlds", "history", w, "--author", "nobody-at-all"),
        ("worlds", "release", "list", w),
        ("worlds", "release", "list", w, "--json"),
        ("worlds", "release", "show", w, "r1"),
        ("worlds", "release", "show", w, "r1", "--json"),
        ("worlds", "show", w),
        ("worlds", "show", w, "--json"),
        ("worlds", "show", w, "--type", "person", "--pk", "p1"),
        ("worlds", "show", w, "--at", "r1"),
        ("worlds", "show", f"{w}/r1", "--json"),
        ("worlds", "audit", w, "--type", "person", "--pk", "p1"),
        ("worlds", "audit", w, "--type", "person", "--pk", "p1", "--json"),
        ("worlds", "audit", w, "--type", "person", "--pk", "p1", "--since", "2000-01-01T00:00:00Z"),
        ("worlds", "diff", f"{w}@{first}", w),
        ("worlds", "diff", f"{w}@{first}", f"{w}/r1", "--json"),
        ("worlds", "diff", f"{w}@{first}", w, "--type", "person", "--limit", "1"),
    ):
        _same(local, remote, *args)
    assert len(_lines(_run(remote, "worlds", "history", w, "--json").output)) == 3  # two batches and the release
    assert len(_lines(_run(remote, "worlds", "show", w, "--json").output)) == 2  # p1, p2
    diffed = _lines(_run(remote, "worlds", "diff", f"{w}@{first}", w, "--json").output)
    assert sorted((d["pk"], d["change"]) for d in diffed[:-1]) == [("p1", "modified"), ("p2", "added")]
    assert [
        e["version"]
        for e in _lines(_run(remote, "worlds", "audit", w, "--type", "person", "--pk", "p1", "--json").output)
    ] == [1, 2]
    _same(local, remote, "worlds", "release", "show", w, "nope", code=1)
    bad = [_run(env, "worlds", "history", "Not A World") for env in (local, remote)]
    assert [r.exit_code for r in bad] == [1, 1] and "INVALID_ARGUMENT" in bad[1].output, bad[1].output

    # --changes (events per kind and change type) and --no-counts travel in the request
    for args in (("worlds", "history", w, "--changes"), ("worlds", "history", w, "--changes", "--no-counts", "--json")):
        _same(local, remote, *args)
    nobody = _run(remote | {"CAUSEWAY_API_TOKEN": "cwy_wrong"}, "worlds", "history", w)
    assert nobody.exit_code == 1 and "UNAUTHENTICATED" in nobody.output and "Traceback" not in nobody.output


def test_history_changes_of_an_older_commit_go_through_the_api(
    written: WrittenWorld, server: ApiProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit made before the committer recorded its change counts: only --changes reads them (from
    its log file), over the API as on Nessie directly."""
    w = written.world
    monkeypatch.setattr(committer, "PROP_CHANGES", "causeway.test-older")  # as an older committer wrote it
    written.commit("old", [obj(w, "p1", "CREATE", 1, name="a"), obj(w, "p2", "CREATE", 1, name="b")])
    local, remote = _envs(server)
    counted = _same(local, remote, "worlds", "history", w, "--changes", "--json")
    assert [d["changes"] for d in _lines(counted.stdout)] == [{"object": {"CREATE": 2}}]
    plain = _same(local, remote, "worlds", "history", w, "--json")
    assert [d["changes"] for d in _lines(plain.stdout)] == [{}]  # without --changes no log file is read
    _same(local, remote, "worlds", "history", w, "--changes")


def test_release_delete_and_create_from_a_commit_go_through_the_api(written: WrittenWorld, server: ApiProcess) -> None:
    w = written.world
    first = written.commit("b1", [obj(w, "p1", "CREATE", 1, name="a")])
    written.commit("b2", [obj(w, "p1", "UPDATE", 2, name="b")])
    local, admin = _envs(server, "admin")
    operator = _envs(server)[1]
    for name in ("r1", "r2"):
        assert _run(operator, "worlds", "release", "create", w, name).exit_code == 0

    # release delete: admin only (refused for an operator, one error line), then the same answers both ways
    denied = _run(operator, "worlds", "release", "delete", w, "r1", "--yes")
    assert denied.exit_code == 1 and "PERMISSION_DENIED" in denied.stderr and "Traceback" not in denied.output
    with server.client("reader") as r:
        r1 = next(x for x in r.list_releases(w) if x.name == "r1")
    gone = _run(admin, "worlds", "release", "delete", w, "r1", "--yes")
    assert gone.exit_code == 0 and gone.stdout == f"deleted release {w}/r1 (was {r1.released_hash[:16]})\n"
    _same(local, admin, "worlds", "release", "delete", w, "r1", "--yes", code=1)  # no such release
    _same(local, admin, "worlds", "release", "list", w)  # r2 only
    assert ("test-admin", "DeleteRelease", w, "OK") in {
        (e["who"], e["method"], e["world"], e["result"]) for e in server.audit()
    }

    # create --from-commit (and every create --dry-run): the same plan both ways, then a real fork
    fresh = f"{w}-c"
    for source in (("--from-commit", first), ("--from-world", w), ("--from-tag", f"release/{w}/r2"), ()):
        _same(local, operator, "worlds", "create", fresh, *source, "--dry-run")
    missing = [
        _run(env, "worlds", "create", fresh, "--from-commit", "ab" * 32, "--dry-run") for env in (local, operator)
    ]
    assert [r.exit_code for r in missing] == [1, 1] and "API NOT_FOUND" in missing[1].stderr
    assert all(f"fork source commit {'ab' * 6} does not exist" in r.stderr for r in missing)
    made = _run(operator, "worlds", "create", fresh, "--from-commit", first)
    assert made.exit_code == 0 and made.stdout.startswith(f"created world {fresh} "), made.output
    with server.client("reader") as r:
        assert r.get_world(fresh).head_hash == first
    _same(local, operator, "worlds", "create", fresh, "--from-commit", first)  # already exists: nothing changed
    _same(local, operator, "worlds", "create", fresh, "--dry-run")
    assert ("test-operator", "ForkWorld", fresh, "OK") in {
        (e["who"], e["method"], e["world"], e["result"]) for e in server.audit()
    }


def test_rollback_goes_through_the_api(written: WrittenWorld, server: ApiProcess) -> None:
    w = written.world
    first = written.commit("b1", [obj(w, "p1", "CREATE", 1, name="a")])
    written.commit("b2", [obj(w, "p1", "UPDATE", 2, name="b"), obj(w, "p2", "CREATE", 1, name="c")])
    local, remote = _envs(server)
    _same(local, remote, "worlds", "rollback", w, "--to", first, "--dry-run")
    _same(local, remote, "worlds", "rollback", w, "--to", first, "--dry-run", "--json")
    bad = [_run(env, "worlds", "rollback", w, "--to", "no-such-release", "--dry-run") for env in (local, remote)]
    assert [r.exit_code for r in bad] == [1, 1] and "Traceback" not in bad[1].output, bad[1].output

    reader = _envs(server, "reader")[1]
    denied = _run(reader, "worlds", "rollback", w, "--to", first, "--yes")
    assert denied.exit_code == 1 and "PERMISSION_DENIED" in denied.output
    done = _run(remote, "worlds", "rollback", w, "--to", first, "--yes", "--json")
    assert done.exit_code == 0, done.output
    doc = _lines(done.output)[0]
    with server.client("reader") as r:
        assert doc["commit"] == r.get_world(w).head_hash and doc["commits_rolled_back"] == 1
        assert [orjson.loads(o)["object_pk"] for p in r.query_at(w) for o in p.objects_json] == ["p1"]
    assert any(e["method"] == "Rollback" and e["world"] == w and e["result"] == "OK" for e in server.audit())
    # after the rollback commit, the plan from the new head is the same both ways
    _same(local, remote, "worlds", "rollback", w, "--to", first, "--dry-run", "--json")
