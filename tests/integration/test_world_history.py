"""History, releases and time travel against the real Nessie, through the API and the CLI."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest
from click.testing import CliRunner

from cli.main import cli
from sinks.nessie import Reference
from streams.settings import Settings
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import link, obj
from tests.integration.worlds_fixtures import WrittenWorld
from tests.nessie_faults import lose_first_answer
from worlds.api import Worlds, WorldsError

pytestmark = pytest.mark.integration
world_settings, wclient, written, api = fx.world_settings, fx.wclient, fx.written, fx.api


def _three_batches(w: WrittenWorld) -> None:
    w.commit("b1", [obj(w.world, f"p{i}", "CREATE", 1, n=i) for i in range(5)] + [link(w.world, "l1", 1, "p0", "p1")])
    w.commit("b2", [obj(w.world, "p0", "UPDATE", 2, n=100), obj(w.world, "p1", "DELETE", 2)])
    w.commit("b3", [obj(w.world, "p9", "CREATE", 1, n=9)])


def test_history_newest_first_with_batches_counts_and_filters(written: WrittenWorld, api: Worlds) -> None:
    _three_batches(written)
    recs = list(api.history(written.world, limit=10, page_size=2))  # pages of 2 through Nessie's log
    assert [r.hash for r in recs[:3]] == written.heads[::-1]
    assert [r.batch_ids for r in recs[:3]] == [("b3",), ("b2",), ("b1",)]
    assert [r.event_count for r in recs[:3]] == [1, 2, 6]
    b1, b2, b3 = recs[2], recs[1], recs[0]
    assert b1.tables["entity_events"].added_rows == 6
    assert b1.tables["entity_common"].added_rows == 5 and b1.tables["entity_edge"].added_rows == 1
    # b2: p0 updated (new row + old masked), p1 deleted (tombstone row + old masked).
    assert b2.tables["entity_common"].added_rows == 2 and b2.tables["entity_common"].removed_rows == 2
    assert "entity_edge" not in b2.tables
    assert b3.tables["entity_common"].added_rows == 1 and b3.tables["entity_common"].removed_rows == 0
    assert all(r.kind == "batch" for r in recs[:3])
    # Per kind and change type, from the log files each commit appended (not a table scan).
    detailed = list(api.history(written.world, limit=3, changes=True))
    assert [dict(r.changes) for r in detailed] == [
        {"object": {"CREATE": 1}},
        {"object": {"UPDATE": 1, "DELETE": 1}},
        {"object": {"CREATE": 5}, "link": {"CREATE": 1}},
    ]

    # The committer records the same counts in the commit's properties: the default page reads no file.
    assert [dict(r.changes) for r in api.history(written.world, limit=3)] == [dict(r.changes) for r in detailed]
    assert detailed[0].properties["causeway.changes"] == '{"object":{"CREATE":1}}'

    assert len(list(api.history(written.world, limit=2))) == 2
    assert [r.hash for r in api.history(written.world, since=b2.time)] == [b3.hash, b2.hash]
    assert [r.hash for r in api.history(written.world, until=b2.time, limit=2)] == [b2.hash, b1.hash]
    assert list(api.history(written.world, author="nobody-at-all")) == []


def test_history_cli_json_and_errors(written: WrittenWorld, world_settings: Settings) -> None:
    _three_batches(written)
    result = CliRunner().invoke(cli, ["worlds", "history", written.world, "--json", "--limit", "2"], obj=world_settings)
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(x) for x in result.output.splitlines() if x.startswith("{")]
    assert [x["batch_ids"] for x in lines] == [["b3"], ["b2"]]
    text = CliRunner().invoke(cli, ["worlds", "history", written.world], obj=world_settings)
    assert text.exit_code == 0 and "commits" in text.output and "batch=b1" in text.output
    assert "link CREATE=1  object CREATE=5" in text.output  # added/changed/deleted without --changes
    missing = CliRunner().invoke(cli, ["worlds", "history", "no-such-world-xyz"], obj=world_settings)
    assert missing.exit_code != 0 and "does not exist" in missing.output and "Traceback" not in missing.output


def test_releases_are_immutable_tags_usable_as_refs_and_fork_sources(written: WrittenWorld, api: Worlds) -> None:
    _three_batches(written)
    rel, created = api.create_release(written.world, "v1", "first cut")
    assert created and rel.released_hash == written.heads[-1] and rel.message == "first cut"
    assert rel.tag == f"release/{written.world}/v1"
    again, created_again = api.create_release(written.world, "v1", "first cut")
    assert not created_again and again.hash == rel.hash  # same state: a no-op
    # The release commit touched no table: the head's tables are the released ones.
    assert api.show(written.world).objects.num_rows == api.show(f"{written.world}/v1").objects.num_rows == 5
    written.commit("b4", [obj(written.world, "p5", "CREATE", 1)])
    with pytest.raises(WorldsError, match="immutable"):
        api.create_release(written.world, "v1")
    with pytest.raises(WorldsError, match="release name"):
        api.create_release(written.world, "Bad Name")
    assert [r.name for r in api.list_releases(written.world)] == ["v1"]
    hist = next(iter(api.history(written.world, limit=2, counts=False)))
    assert hist.kind == "batch"
    kinds = [r.kind for r in api.history(written.world, limit=3)]
    assert kinds == ["batch", "release", "batch"]
    # A release is a fork source (Nessie tag) and keeps the released state after the world moved on.
    fork = f"{written.world}-f"
    tag = api.client.get_reference(rel.tag)
    api.client.create_branch(f"world-{fork}", Reference(tag.name, "TAG", tag.hash))
    assert set(api.show(fork).objects.column("object_pk").to_pylist()) == {"p0", "p2", "p3", "p4", "p9"}
    assert api.delete_release(written.world, "v1").name == "v1"
    with pytest.raises(WorldsError, match="does not exist"):
        api.get_release(written.world, "v1")


def test_time_travel_by_hash_and_time(written: WrittenWorld, api: Worlds) -> None:
    _three_batches(written)
    first = api.show(f"{written.world}@{written.heads[0]}", entity_type="person", pk="p0")
    assert first.resolved.hash == written.heads[0]
    assert [(r["object_pk"], r["version"], r["properties"]) for r in first.objects.to_pylist()] == [
        ("p0", 1, '{"n":0}')
    ]
    now = api.show(written.world, pk="p1")
    assert now.objects.num_rows == 0  # deleted in b2
    # A time resolves to the last commit at or before it, and says which one.
    b2_time = next(r.time for r in api.history(written.world) if r.hash == written.heads[1])
    at = api.show(f"{written.world}@{(b2_time + timedelta(milliseconds=1)).isoformat()}", pk="p0")
    assert at.resolved.hash == written.heads[1] and at.objects.column("version").to_pylist() == [2]
    with pytest.raises(WorldsError, match="no commit at or before"):
        api.show(f"{written.world}@2001-01-01T00:00:00Z")
    with pytest.raises(WorldsError, match="not on world"):
        api.show(f"{written.world}@{'0' * 64}")


def test_time_travel_does_not_block_the_writer(written: WrittenWorld, api: Worlds) -> None:
    """A pinned read keeps seeing its commit while the writer moves the branch on."""
    written.commit("b1", [obj(written.world, "p0", "CREATE", 1, n=0)])
    resolved = api.resolve(written.world)
    table = api.table(resolved.pinned, "entity_common")
    assert table is not None
    written.commit("b2", [obj(written.world, "p0", "UPDATE", 2, n=1)])  # lands while the read is open
    assert table.scan().to_arrow().column("version").to_pylist() == [1]
    assert api.show(written.world).objects.column("version").to_pylist() == [2]


def test_show_cli_names_the_commit_used(written: WrittenWorld, world_settings: Settings, api: Worlds) -> None:
    _three_batches(written)
    # The hash prefix the CLI prints is enough.
    result = CliRunner().invoke(
        cli, ["worlds", "show", written.world, "--at", written.heads[0][:16], "--pk", "p0"], obj=world_settings
    )
    assert result.exit_code == 0, result.output
    assert written.heads[0][:16] in result.output and "person/p0 v1" in result.output
    api.create_release(written.world, "r1")
    by_release = CliRunner().invoke(
        cli, ["worlds", "show", written.world, "--at", "r1", "--pk", "p0"], obj=world_settings
    )
    assert by_release.exit_code == 0 and "person/p0 v2" in by_release.output, by_release.output
    missing = CliRunner().invoke(cli, ["worlds", "show", written.world, "--at", "abcdef0123"], obj=world_settings)
    assert missing.exit_code != 0 and "not on branch" in missing.output


def test_release_records_the_state_it_tagged_when_a_writer_commits_meanwhile(
    written: WrittenWorld, api: Worlds
) -> None:
    written.commit("b1", [obj(written.world, "p1", "CREATE", 1)])
    real_head = api.head

    def head_then_writer_commits(world: str):  # type: ignore[no-untyped-def]
        ref = real_head(world)
        if len(written.heads) == 1:
            written.commit("b2", [obj(written.world, "p2", "CREATE", 1)])  # lands after the read
        return ref

    api.head = head_then_writer_commits  # type: ignore[method-assign]
    rel, _ = api.create_release(written.world, "r")
    # Nessie rebased the table-less release commit onto the writer's commit: that is what the tag holds.
    assert rel.released_hash == written.heads[-1]
    assert set(api.show(f"{written.world}/r").objects.column("object_pk").to_pylist()) == {"p1", "p2"}


def test_a_release_whose_marker_answer_is_lost_is_found_by_its_commit_id_and_made_once(
    written: WrittenWorld, api: Worlds, monkeypatch: pytest.MonkeyPatch
) -> None:
    written.commit("b1", [obj(written.world, "p1", "CREATE", 1)])
    before = written.heads[-1]
    landed = lose_first_answer(api.client, monkeypatch)
    rel, created = api.create_release(written.world, "lost")
    assert created and landed == [rel.hash] and rel.released_hash == before
    monkeypatch.undo()
    kinds = [r.kind for r in api.history(written.world, limit=3)]
    assert kinds[:2] == ["release", "batch"]  # one marker commit, not two
