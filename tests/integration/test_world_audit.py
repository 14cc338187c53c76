"""The entity audit trail against the real Nessie: order, commits, cause chains, pushdown, links, CLI."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from click.testing import CliRunner

from cli.main import cli
from streams.settings import Settings
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import link, obj
from tests.integration.worlds_fixtures import WrittenWorld
from worlds.api import Worlds

pytestmark = pytest.mark.integration
world_settings, wclient, written, api = fx.world_settings, fx.wclient, fx.written, fx.api


def test_audit_trail_of_one_object_and_one_link(written: WrittenWorld, api: Worlds) -> None:
    w = written.world
    root = obj(w, "a0", "CREATE", 1, n=0)
    cause = replace(obj(w, "a1", "CREATE", 1, n=1), caused_by=root.event_id)
    written.commit("b1", [root, cause, obj(w, "p7", "CREATE", 1, n=1), link(w, "l1", 1, "p7", "a0")])
    written.commit("b2", [obj(w, f"q{i}", "CREATE", 1) for i in range(20)])  # other entities only
    upd = replace(obj(w, "p7", "UPDATE", 2, n=2), caused_by=cause.event_id)
    written.commit("b3", [upd])
    stale = obj(w, "p7", "UPDATE", 1, n=-1)  # an older version arriving late: logged, not applied
    written.commit("b4", [obj(w, "p7", "DELETE", 3), stale])

    trail = api.audit(w, "person", "p7")
    assert [(e.change_type, e.version, e.applied) for e in trail] == [
        ("CREATE", 1, True),
        ("UPDATE", 2, True),
        ("DELETE", 3, True),
        ("UPDATE", 1, False),
    ]
    heads = written.heads
    assert [e.commit_hash for e in trail] == [heads[0], heads[2], heads[3], heads[3]]
    assert trail[1].before is None and trail[1].after == {"n": 2}
    assert trail[1].caused_by == (cause.event_id, root.event_id)  # the chain, nearest first
    assert [e.batch_id for e in trail] == ["b1", "b3", "b4", "b4"]

    # since/until cut the trail by commit time.
    assert [e.version for e in api.audit(w, "person", "p7", since=trail[2].committed_at)] == [3, 1]
    # As of an earlier state: the trail up to that commit.
    assert [e.version for e in api.audit(f"{w}@{heads[2]}", "person", "p7")] == [1, 2]

    links = api.audit(w, "knows", "l1", kind="link")
    assert [(e.change_type, e.from_pk, e.to_pk) for e in links] == [("CREATE", "p7", "a0")]

    # Pushdown: the batch that held only other entities (pks q0..q19) is not read.
    scan = api.audit_scan(api.resolve(w), "person", "p7")
    assert scan is not None
    log, pushed = scan
    read = {t.file.file_path for t in pushed.plan_files()}
    every = {t.file.file_path for t in log.scan().plan_files()}
    assert read < every and len(every) - len(read) >= 1


def test_audit_cli(written: WrittenWorld, world_settings: Settings) -> None:
    w = written.world
    written.commit("b1", [obj(w, "p1", "CREATE", 1, n=1)])
    written.commit("b2", [obj(w, "p1", "UPDATE", 2, n=2)])
    out = CliRunner().invoke(
        cli, ["worlds", "audit", w, "--type", "person", "--pk", "p1", "--json"], obj=world_settings
    )
    assert out.exit_code == 0, out.output
    lines = [orjson.loads(x) for x in out.output.splitlines()]
    assert [(x["version"], x["commit"]) for x in lines] == [(1, written.heads[0]), (2, written.heads[1])]
    text = CliRunner().invoke(cli, ["worlds", "audit", w, "--type", "person", "--pk", "p1"], obj=world_settings)
    assert text.exit_code == 0 and "changes  2" in text.output
    bad = CliRunner().invoke(cli, ["worlds", "audit", w, "--type", "person"], obj=world_settings)
    assert bad.exit_code != 0 and "--pk" in bad.output
