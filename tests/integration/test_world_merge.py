"""Three-way world merge against the real Nessie: strategies, conflict types, MANUAL, merge points, a race."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from cli.main import cli
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import link, obj
from tests.integration.worlds_fixtures import WrittenWorld, fork
from worlds.api import Worlds

pytestmark = pytest.mark.integration
world_settings, wclient, written, api = fx.world_settings, fx.wclient, fx.written, fx.api


def state(api: Worlds, world: str) -> dict[tuple[str, str], dict[str, Any]]:
    snap = api.show(world)
    out = {
        ("object", r["object_pk"]): {**orjson.loads(r["properties"]), "_v": r["version"]}
        for r in snap.objects.to_pylist()
    }
    for r in snap.links.to_pylist():
        out[("link", r["link_pk"])] = {"from": r["from_pk"], "to": r["to_pk"], "_v": r["version"]}
    return out


def events(api: Worlds, world: str) -> list[dict[str, Any]]:
    t = api.table(f"{api.branch(world)}@{api.head(world).hash}", "entity_events")
    assert t is not None
    return t.scan().to_arrow().to_pylist()


@pytest.fixture
def pair(written: WrittenWorld, api: Worlds) -> tuple[WrittenWorld, WrittenWorld]:
    w = written.world
    written.commit(
        "base",
        [obj(w, f"p{i}", "CREATE", 1, name=f"n{i}", team="core") for i in range(1, 7)] + [link(w, "k1", 1, "p1", "p2")],
    )
    return written, fork(written, api, f"{w}-src")


def test_clean_merge_takes_both_sides_records_events_and_merge_point(pair, api: Worlds) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="n1", team="ops"), obj(s, "p7", "CREATE", 1, name="new")])
    source.commit("s2", [obj(s, "p2", "DELETE", 2), link(s, "k2", 1, "p3", "p7")])
    target.commit("t1", [obj(t, "p3", "UPDATE", 2, name="n3", team="platform")])
    dry = api.merge_worlds(s, t, "NORMAL", dry_run=True)
    head_before = api.head(t).hash
    assert dry.status == "planned" and api.head(t).hash == head_before
    # Only the data files that differ were read: the base file is shared by all three states.
    assert dry.result.taken["source"] == 4 and not dry.result.conflicts

    out = api.merge_worlds(s, t, "NORMAL")
    assert out.status == "merged" and out.committed == api.head(t).hash
    assert (out.result.summary(), out.base) == (dry.result.summary(), dry.base)
    got = state(api, t)
    assert got[("object", "p1")]["team"] == "ops" and got[("object", "p3")]["team"] == "platform"
    assert ("object", "p2") not in got and got[("object", "p7")]["name"] == "new"
    assert got[("link", "k2")]["to"] == "p7"
    assert got[("object", "p1")]["_v"] == 3  # one above the highest version on any side

    merged = [e for e in events(api, t) if (e["source"] or "").startswith("merge:")]
    assert len(merged) == 4 and {e["source"] for e in merged} == {f"merge:{s}@{out.source_hash}"}
    src_ids = {e["event_id"] for e in events(api, s)}
    assert all(e["caused_by"] in src_ids and e["applied"] for e in merged)
    commit = next(iter(next(iter(api.client.history(api.branch(t), max_records=1)))))
    assert commit.properties["causeway.merge.source"] == s
    assert commit.properties["causeway.merge.source_hash"] == out.source_hash

    # The next merge starts from the last merge point: nothing new, nothing to merge, no conflict.
    again = api.merge_worlds(s, t, "NORMAL")
    assert again.status == "nothing-to-merge" and again.base == out.source_hash
    source.commit("s3", [obj(s, "p4", "UPDATE", 2, name="n4", team="x")])
    third = api.merge_worlds(s, t, "NORMAL")
    assert third.status == "merged" and third.result.taken["source"] == 1 and not third.result.conflicts


def _conflicted(pair) -> tuple[str, str]:
    """Each conflict type once (besides SCHEMA): p1 both modified, p2 ADD-ADD-like on new key, ..."""
    target, source = pair
    t, s = target.world, source.world
    source.commit(
        "s1",
        [
            obj(s, "p1", "UPDATE", 2, name="src", team="core"),  # MODIFY_MODIFY (different property)
            obj(s, "p3", "UPDATE", 2, name="n3", team="src"),  # MODIFY_MODIFY (same property)
            obj(s, "n1", "CREATE", 1, name="src"),  # ADD_ADD
            obj(s, "p4", "UPDATE", 2, name="n4", team="src"),  # MODIFY_DELETE
            obj(s, "p5", "DELETE", 2),  # DELETE_MODIFY
            link(s, "k9", 1, "p1", "p6"),  # ORPHAN_LINK (target deletes p6)
        ],
    )
    target.commit(
        "t1",
        [
            obj(t, "p1", "UPDATE", 2, name="n1", team="tgt"),
            obj(t, "p3", "UPDATE", 2, name="n3", team="tgt"),
            obj(t, "n1", "CREATE", 1, name="tgt"),
            obj(t, "p4", "DELETE", 2),
            obj(t, "p5", "UPDATE", 2, name="n5", team="tgt"),
            obj(t, "p6", "DELETE", 2),
        ],
    )
    return s, t


def test_normal_aborts_on_every_conflict_type_and_dry_run_matches(pair, api: Worlds) -> None:
    s, t = _conflicted(pair)
    head = api.head(t).hash
    dry = api.merge_worlds(s, t, "NORMAL", dry_run=True)
    real = api.merge_worlds(s, t, "NORMAL")
    assert real.status == "conflicts" and api.head(t).hash == head  # nothing written
    assert (
        real.result.conflict_counts
        == dry.result.conflict_counts
        == {
            "ADD_ADD": 1,
            "DELETE_MODIFY": 1,
            "MODIFY_DELETE": 1,
            "MODIFY_MODIFY": 2,
            "ORPHAN_LINK": 1,
        }
    )
    assert [c.to_json() for c in real.result.conflicts] == [c.to_json() for c in dry.result.conflicts]
    # B into A: the same keys, mirrored types.
    back = api.merge_worlds(t, s, "NORMAL", dry_run=True)
    assert back.result.conflict_counts == real.result.conflict_counts


@pytest.mark.parametrize(
    "strategy,expect",
    [
        ("THEIRS", {"p1": "core", "p3": "src", "n1": "src", "p4": "src", "p5": None, "k9": True, "p6": True}),
        ("OURS", {"p1": "tgt", "p3": "tgt", "n1": "tgt", "p4": None, "p5": "tgt", "k9": False, "p6": False}),
        ("FIELD_LEVEL+THEIRS", {"p1": ("src", "tgt"), "p3": "src", "n1": "src", "p4": "src", "p5": None}),
    ],
)
def test_resolving_strategies(pair, api: Worlds, strategy: str, expect: dict[str, Any]) -> None:
    s, t = _conflicted(pair)
    out = api.merge_worlds(s, t, strategy)
    # OURS keeps every conflicting key as the target has it and drops the orphan link: no change left.
    assert out.status == ("nothing-to-merge" if strategy == "OURS" else "merged"), out.to_json()
    got = state(api, t)
    for pk, want in expect.items():
        if pk.startswith("k"):
            assert (("link", pk) in got) is want
        elif pk == "p6":
            assert (("object", pk) in got) is want
        elif want is None:
            assert ("object", pk) not in got
        elif isinstance(want, tuple):
            assert (got[("object", pk)]["name"], got[("object", pk)]["team"]) == want
        else:
            v = got[("object", pk)]
            assert want in (v.get("team"), v.get("name")), (pk, v)


def test_timestamp_wins_and_per_type_override(pair, api: Worlds) -> None:
    target, source = pair
    t, s = target.world, source.world
    late = obj(s, "p1", "UPDATE", 2, name="late")
    early = obj(t, "p1", "UPDATE", 2, name="early")
    from dataclasses import replace

    source.commit("s1", [replace(late, occurred_at_ms=2_000_000_000_000), obj(s, "c1", "CREATE", 1, "team", v="s")])
    target.commit("t1", [early, obj(t, "c1", "CREATE", 1, "team", v="t")])
    out = api.merge_worlds(s, t, "TIMESTAMP_WINS", strategy_for={"team": "OURS"})
    assert out.status == "merged"
    got = state(api, t)
    assert got[("object", "p1")]["name"] == "late" and got[("object", "c1")]["v"] == "t"


def test_manual_conflicts_resolved_and_continued(pair, api: Worlds, world_settings, tmp_path) -> None:
    s, t = _conflicted(pair)
    ops = Worlds(world_settings.replace(data_dir=str(tmp_path)), api.client)
    out = ops.merge_worlds(s, t, "MANUAL")
    assert out.status == "pending"
    pending = ops.pending_merge(t)
    ids = {c["pk"] + "/" + c["conflict"]: c["id"] for c in pending["conflicts"]}
    runner = CliRunner()
    env = {"CAUSEWAY_DATA_DIR": str(tmp_path), "CAUSEWAY_WAREHOUSE": world_settings.warehouse}
    res = runner.invoke(cli, ["worlds", "conflicts", "list", t, "--json"], env=env)
    assert res.exit_code == 0, res.output
    assert len(orjson.loads(res.output)["conflicts"]) == 6
    for key, cid in ids.items():
        take = 'value={"name": "hand", "team": "made"}' if key == "p1/MODIFY_MODIFY" else "source"
        res = runner.invoke(cli, ["worlds", "conflicts", "resolve", t, str(cid), "--take", take], env=env)
        assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["worlds", "merge", "--continue", "--into", t, "--json"], env=env)
    assert res.exit_code == 0, res.output
    assert orjson.loads(res.output)["status"] == "merged"
    got = state(api, t)
    assert got[("object", "p1")]["name"] == "hand" and ("link", "k9") in got and ("object", "p6") in got
    res = runner.invoke(cli, ["worlds", "conflicts", "list", t], env=env)
    assert res.exit_code != 0 and "no pending merge" in res.output


def test_merge_racing_a_live_committer(pair, api: Worlds) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, f"m{i}", "CREATE", 1, n=i) for i in range(40)])
    stop = threading.Event()
    written_ids: list[str] = []

    def writer() -> None:
        i = 0
        while not stop.is_set() and i < 30:
            evs = [obj(t, f"w{i}", "CREATE", 1, n=i)]
            target.commit(f"w{i}", evs)
            written_ids.extend(e.event_id for e in evs)
            i += 1

    th = threading.Thread(target=writer)
    th.start()
    try:
        out = api.merge_worlds(s, t, "NORMAL")
    finally:
        stop.set()
        th.join()
    assert out.status == "merged"
    evs = events(api, t)
    ids = Counter(e["event_id"] for e in evs)
    assert all(n == 1 for n in ids.values())  # nothing doubled
    assert set(written_ids) <= set(ids)  # nothing of the writer lost
    got = state(api, t)
    assert all(("object", f"m{i}") in got for i in range(40))
    assert all(("object", f"w{i}") in got for i in range(len(written_ids)))
    assert sum(1 for e in evs if (e["source"] or "").startswith("merge:")) == 40


@pytest.mark.parametrize("overlap", [False, True])
def test_target_moving_between_plan_and_commit(pair, api: Worlds, monkeypatch, overlap: bool) -> None:
    """A writer commits right after the first plan: on other keys the planned commit still lands
    (rebased over it); on a merged key the merge plans again against the new head."""
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="src", team="core"), obj(s, "p2", "UPDATE", 2, name="s2")])
    plan = api.plan_merge
    calls = []

    def racing_plan(*a: Any, **kw: Any):
        out = plan(*a, **kw)
        calls.append(out.target_head)
        if len(calls) == 1:
            pk = "p1" if overlap else "p5"
            target.commit("race", [obj(t, pk, "UPDATE", 2, name="writer" if pk == "p5" else "n1", team="tgt")])
        return out

    monkeypatch.setattr(api, "plan_merge", racing_plan)
    out = api.merge_worlds(s, t, "FIELD_LEVEL")
    assert out.status == "merged" and out.attempts == (2 if overlap else 1)
    got = state(api, t)
    assert got[("object", "p2")]["name"] == "s2"
    if overlap:  # planned again: the writer's team and the source's name merge property-wise
        assert (got[("object", "p1")]["name"], got[("object", "p1")]["team"]) == ("src", "tgt")
        assert calls[1] != calls[0]
    else:
        assert got[("object", "p5")]["name"] == "writer" and got[("object", "p1")]["name"] == "src"
    ids = Counter(e["event_id"] for e in events(api, t))
    assert all(n == 1 for n in ids.values())


def _add_column(written: WrittenWorld, name: str, typ: Any) -> None:
    cat = written.committer.catalog(written.branch)
    cat.begin()
    try:
        table = cat.load_table((written.committer.settings.namespace, "entity_common"))
        tx = table.transaction()
        with tx.update_schema() as update:
            update.add_column(name, typ)
        tx.commit_transaction()
        cat.publish(f"test: add {name}", {})
    finally:
        cat.discard()


def test_schema_conflict_blocks_every_strategy(pair, api: Worlds) -> None:
    from pyiceberg.types import LongType, StringType

    target, source = pair
    _add_column(source, "level", LongType())
    _add_column(target, "level", StringType())
    for strategy in ("NORMAL", "THEIRS"):
        out = api.merge_worlds(source.world, target.world, strategy)
        assert out.status == "conflicts"
        assert [(c["table"], c["column"]) for c in out.schema] == [("entity_common", "level")]


def test_merging_back_uses_the_earlier_merge_as_base(pair, api: Worlds) -> None:
    target, source = pair
    t, s = target.world, source.world
    source.commit("s1", [obj(s, "p1", "UPDATE", 2, name="n1", team="ops")])
    target.commit("t1", [obj(t, "p2", "UPDATE", 2, name="n2", team="platform"), obj(t, "p3", "DELETE", 2)])
    first = api.merge_worlds(s, t, "NORMAL")
    assert first.status == "merged"
    back = api.merge_worlds(t, s, "NORMAL")  # base: the source state the first merge took
    assert back.status == "merged" and back.base == first.source_hash and not back.result.conflicts

    def content(world: str) -> dict:
        return {k: {p: v for p, v in props.items() if p != "_v"} for k, props in state(api, world).items()}

    assert content(s) == content(t)
    assert api.merge_worlds(s, t, "NORMAL").status == "nothing-to-merge"
