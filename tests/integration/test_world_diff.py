"""Entity/property diff against the real Nessie: exact changes, and only the differing files are read."""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from cli.main import cli
from sinks.nessie import Reference
from streams.settings import Settings
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import link, obj
from tests.integration.worlds_fixtures import WrittenWorld
from worlds.api import Worlds

pytestmark = pytest.mark.integration
world_settings, wclient, written, api = fx.world_settings, fx.wclient, fx.written, fx.api


def _data_files(api: Worlds, pinned: str) -> set[str]:
    table = api.table(pinned, "entity_common")
    assert table is not None
    return {t.file.file_path for t in table.scan().plan_files()}


def _files_holding(api: Worlds, paths: set[str], pks: set[str]) -> set[str]:
    """Test-side oracle: the data files (read directly) that hold a row of one of ``pks``."""
    out = set()
    for path in paths:
        with open(path.removeprefix("file://"), "rb") as f:
            if set(pq.read_table(f, columns=["object_pk"]).column("object_pk").to_pylist()) & pks:
                out.add(path)
    return out


def test_diff_reads_only_differing_files_and_reports_properties(written: WrittenWorld, api: Worlds) -> None:
    w = written.world
    for i in range(6):  # six batches: six data files shared by both sides after the fork
        written.commit(f"s{i}", [obj(w, f"p{i}{j}", "CREATE", 1, n=j, tag="x") for j in range(5)])
    fork = f"{w}-b"
    head = api.head(w)
    api.client.create_branch(f"world-{fork}", Reference(head.name, "BRANCH", head.hash))
    at_fork = _data_files(api, f"{head.name}@{head.hash}")

    # B: two new objects, p11 updated (two properties), p22 deleted, a new link.
    other = WrittenWorld(fork, f"world-{fork}", written.committer, written.client, next_offset=1000)
    other.commit(
        "b1",
        [
            obj(w, "n1", "CREATE", 1, n=1),
            obj(w, "n2", "CREATE", 1, n=2),
            obj(w, "p11", "UPDATE", 2, n=99, tag="y"),
            obj(w, "p22", "DELETE", 2),
            link(w, "l1", 1, "n1", "n2"),
        ],
    )
    # A moves on too: p33 updated after the fork.
    written.commit("a1", [obj(w, "p33", "UPDATE", 2, n=-3, tag="x")])

    result = api.diff(w, fork)
    changes = {(c.kind, c.pk): c for c in result.changes}
    assert {k: c.change for k, c in changes.items()} == {
        ("object", "n1"): "added",
        ("object", "n2"): "added",
        ("object", "p11"): "modified",
        ("object", "p22"): "removed",
        ("object", "p33"): "modified",
        ("link", "l1"): "added",
    }
    p11 = changes[("object", "p11")]
    assert [(p.name, p.before, p.after) for p in p11.properties] == [("n", 1, 99), ("tag", "x", "y")]
    assert [(p.name, p.before, p.after) for p in changes[("object", "p33")].properties] == [("n", -3, 3)]
    assert result.counts()["object"]["person"] == {"added": 2, "removed": 1, "modified": 2}

    # Files read: the ones only one side has, plus the shared files holding a row one side masked.
    side_a, side_b = _data_files(api, result.a.pinned), _data_files(api, result.b.pinned)
    expected = (side_a ^ side_b) | _files_holding(api, at_fork, {"p11", "p22", "p33"})
    common = next(t for t in result.tables if t.table == "entity_common")
    assert set(common.data_files_read) == expected
    assert common.data_files_skipped == len((side_a & side_b) - expected) >= 3
    assert common.rows_read < 30 + 5  # far from the 30+ rows of both sides


def test_diff_of_release_against_head_and_cli(written: WrittenWorld, api: Worlds, world_settings: Settings) -> None:
    w = written.world
    written.commit("s1", [obj(w, "p1", "CREATE", 1, n=1)])
    api.create_release(w, "v1")
    written.commit("s2", [obj(w, "p1", "UPDATE", 2, n=2), obj(w, "p2", "CREATE", 1)])
    assert api.diff(f"{w}/v1", f"{w}/v1").changes == []
    out = CliRunner().invoke(cli, ["worlds", "diff", f"{w}/v1", w, "--json"], obj=world_settings)
    assert out.exit_code == 0, out.output
    lines = [orjson.loads(x) for x in out.output.splitlines()]
    assert {(x["pk"], x["change"]) for x in lines[:-1]} == {("p1", "modified"), ("p2", "added")}
    assert lines[-1]["summary"]["counts"]["object"]["person"] == {"added": 1, "removed": 0, "modified": 1}
    text = CliRunner().invoke(cli, ["worlds", "diff", f"{w}/v1", w], obj=world_settings)
    assert text.exit_code == 0 and "~ object person/p1" in text.output and "n: 1 -> 2" in text.output
    bad = CliRunner().invoke(cli, ["worlds", "diff", f"{w}/nope", w], obj=world_settings)
    assert bad.exit_code != 0 and "does not exist" in bad.output
