"""Rollback against the real Nessie: state, kept history and bookkeeping, and races with a live committer."""

from __future__ import annotations

import threading
from collections import Counter

import orjson
import pytest
from click.testing import CliRunner

from cli.main import cli
from ops.replay.plan import rewrite
from ops.replay.run import ReplayCommitter
from sinks.committer import Batch, BatchCommitter
from sinks.nessie import Reference
from sinks.readback import read_branch
from streams.settings import Settings
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import OBJ, batch, obj
from tests.integration.worlds_fixtures import WrittenWorld
from tests.nessie_faults import lose_first_answer
from worlds.api import Worlds, WorldsError

pytestmark = pytest.mark.integration
world_settings, wclient, written, api = fx.world_settings, fx.wclient, fx.written, fx.api


def _state(settings: Settings, ref: str) -> tuple[dict, Counter]:
    s = read_branch(settings, ref)
    return {**{("o", k): v for k, v in s.objects.items()}, **{("l", k): v for k, v in s.links.items()}}, s.event_ids


def test_rollback_restores_tables_keeps_history_offsets_and_marks_path(
    written: WrittenWorld, api: Worlds, world_settings: Settings
) -> None:
    w = written.world
    written.commit("b1", [obj(w, "p1", "CREATE", 1, n=1), obj(w, "p2", "CREATE", 1, n=2)])
    target = written.heads[-1]
    target_state = _state(world_settings, f"{written.branch}@{target}")
    rolled_events = [obj(w, "p1", "UPDATE", 2, n=10), obj(w, "p3", "CREATE", 1, n=3)]
    written.commit("b2", rolled_events)
    written.commit("b3", [obj(w, "p2", "DELETE", 2)])
    before_head = written.heads[-1]
    offsets_before = written.committer.committed_offsets(written.branch)

    plan = api.plan_rollback(w, f"{w}@{target}")
    assert plan.rolled_back == (written.heads[2], written.heads[1]) and plan.batch_ids == ("b3", "b2")
    assert api.head(w).hash == before_head  # planning writes nothing

    out = api.rollback(w, f"{w}@{target}")
    assert out.hash is not None and out.attempts == 1
    assert _state(world_settings, written.branch) == target_state
    # History kept: the rollback is a new commit on top of the old head, recording the range.
    rec = next(iter(api.history(w, limit=1, changes=True)))
    assert rec.kind == "rollback" and rec.properties["causeway.rollback.to"] == target
    # Going back to older snapshots adds no rows and appends no events.
    assert dict(rec.changes) == {} and not any(c.added_rows for c in rec.tables.values())
    assert (
        rec.properties["causeway.rollback.from"] == before_head
        and rec.properties["causeway.rollback.batches"] == "b3,b2"
    )
    assert [r.hash for r in api.history(w, limit=4)][1:] == written.heads[::-1]
    # Offsets are not rewound: Kafka redelivering b2 (same offsets) applies nothing.
    assert written.committer.committed_offsets(written.branch) == offsets_before
    again = written.committer.commit_batch(batch(w, "b2-redelivered", rolled_events, 2))
    assert again.already_committed and again.events_replayed == 2
    assert _state(world_settings, written.branch) == target_state
    # New events land on top of the rolled-back state.
    written.commit("b4", [obj(w, "p4", "CREATE", 1, n=4)])
    objects = _state(world_settings, written.branch)[0]
    assert set(objects) == {("o", "p1"), ("o", "p2"), ("o", "p4")} and objects[("o", "p1")]["version"] == 1
    # A replay into a new world forked from the rolled-back state re-applies the rolled-back events.
    fork = f"{w}-replay"
    head = api.head(w)
    api.client.create_branch(f"world-{fork}", Reference(head.name, "BRANCH", head.hash))
    replay = ReplayCommitter(BatchCommitter(world_settings, written.client))
    moved = [rewrite(e, fork) for e in rolled_events]  # what `replay --into-world` feeds the committer
    replay.commit_batch(batch(fork, "replay-b2", moved, 2))  # the original offsets, 2 and 3
    replayed = _state(world_settings, f"world-{fork}")[0]
    assert replayed[("o", "p1")]["version"] == 2 and ("o", "p3") in replayed
    # A rollback to where the world already is changes nothing.
    assert api.rollback(w, f"{w}@{api.head(w).hash}").hash is None


def test_rollback_to_a_release_and_cli_dry_run(written: WrittenWorld, api: Worlds, world_settings: Settings) -> None:
    w = written.world
    written.commit("b1", [obj(w, "p1", "CREATE", 1, n=1)])
    api.create_release(w, "good")
    written.commit("b2", [obj(w, "p1", "UPDATE", 2, n=2)])
    head = api.head(w).hash
    dry = CliRunner().invoke(cli, ["worlds", "rollback", w, "--to", "good", "--dry-run", "--json"], obj=world_settings)
    assert dry.exit_code == 0, dry.output
    plan = orjson.loads(dry.output)
    assert plan["commits_rolled_back"] == 1 and plan["batches_rolled_back"] == ["b2"] and plan["commit"] is None
    assert api.head(w).hash == head  # the dry run wrote nothing
    real = CliRunner().invoke(cli, ["worlds", "rollback", w, "--to", "good", "--yes"], obj=world_settings)
    assert real.exit_code == 0, real.output
    assert api.show(w, pk="p1").objects.column("version").to_pylist() == [1]
    other = CliRunner().invoke(cli, ["worlds", "rollback", w, "--to", "0" * 64, "--yes"], obj=world_settings)
    assert other.exit_code != 0 and "not on world" in other.output and "Traceback" not in other.output


def test_rollback_refused_when_the_head_moves_and_forced_retry(written: WrittenWorld, api: Worlds) -> None:
    w = written.world
    written.commit("b1", [obj(w, "p1", "CREATE", 1)])
    target = written.heads[-1]
    written.commit("b2", [obj(w, "p2", "CREATE", 1)])
    real_plan = api.plan_rollback

    def plan_then_worker_commits(world: str, to: object, **kw: object):  # type: ignore[no-untyped-def]
        plan = real_plan(world, to)  # type: ignore[arg-type]
        if len(written.heads) < 4:
            written.commit(f"w{len(written.heads)}", [obj(w, f"q{len(written.heads)}", "CREATE", 1)])
        return plan

    api.plan_rollback = plan_then_worker_commits  # type: ignore[method-assign]
    with pytest.raises(WorldsError, match="moved during the rollback"):
        api.rollback(w, f"{w}@{target}")
    assert api.head(w).hash == written.heads[-1]  # the worker's commit stands, nothing else changed
    out = api.rollback(w, f"{w}@{target}", force=True)  # planned again from the new head: lands
    assert out.attempts == 2 and out.plan.head == written.heads[-1]
    assert set(api.show(w).objects.column("object_pk").to_pylist()) == {"p1"}


def test_a_forced_rollback_keeps_planning_again_while_a_worker_keeps_moving_the_head(
    written: WrittenWorld, api: Worlds, world_settings: Settings
) -> None:
    """A worker that commits between every plan and its commit does not starve a forced rollback:
    it plans again from each new head, up to the write path's retry budget."""
    w = written.world
    written.commit("b1", [obj(w, "p1", "CREATE", 1)])
    target = written.heads[-1]
    written.commit("b2", [obj(w, "p2", "CREATE", 1)])
    real_plan = api.plan_rollback
    moved = []

    def plan_then_worker_commits(world: str, to: object, **kw: object):  # type: ignore[no-untyped-def]
        plan = real_plan(world, to)  # type: ignore[arg-type]
        if len(moved) < 4:
            moved.append(f"w{len(moved)}")
            written.commit(moved[-1], [obj(w, f"q{len(moved)}", "CREATE", 1)])
        return plan

    api.plan_rollback = plan_then_worker_commits  # type: ignore[method-assign]
    out = api.rollback(w, f"{w}@{target}", force=True)
    assert out.attempts == 5 and out.plan.head == written.heads[-1]
    assert len(moved) == 4 and world_settings.commit_retries >= 4
    assert set(api.show(w).objects.column("object_pk").to_pylist()) == {"p1"}


def test_rollback_racing_a_live_committer(written: WrittenWorld, api: Worlds, world_settings: Settings) -> None:
    """A worker commits as often as a busy world does while the rollback lands: either side retries;
    nothing is lost or doubled, and the worker's later batches sit on top of the rolled-back state."""
    w = written.world
    written.commit("seed", [obj(w, f"s{i}", "CREATE", 1) for i in range(5)])
    target = written.heads[-1]
    written.commit("gone", [obj(w, "x", "CREATE", 1)])
    committed: list[tuple[str, str]] = []  # (batch id, hash) in the order the worker saw them
    stop = threading.Event()
    worker = BatchCommitter(world_settings, written.client)

    def run() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            ev = obj(w, f"k{n}", "CREATE", 1, n=n)
            out = worker.commit_batch(Batch.from_sources(w, f"k{n}", [(ev, batch(w, "_", [ev], 100 + n).sources[0])]))
            committed.append((f"k{n}", out.hash))
            if n > 80:
                break
            # A world at full rate commits about this often (batch_flush_events fills while the previous
            # commit is in flight); back to back (~30 ms here) it wins most races against an ~80 ms plan.
            stop.wait(0.1)

    t = threading.Thread(target=run)
    t.start()
    try:
        while len(committed) < 2:
            stop.wait(0.05)
        outcome = None
        for _ in range(3):
            try:
                outcome = api.rollback(w, f"{w}@{target}", force=True)
                break
            except WorldsError:
                continue
        # A commit in flight when the rollback returned may have landed before it; the second one
        # after it started after it, so only then has the worker surely committed on top.
        seen = len(committed)
        while len(committed) < seen + 2 and t.is_alive():
            stop.wait(0.05)
    finally:
        stop.set()
        t.join(timeout=120)
    assert outcome is not None and outcome.hash is not None
    history = [r for r in api.history(w, limit=200, counts=False)]
    order = [r.hash for r in history]
    rb = order.index(outcome.hash)
    after = {r.batch_ids[0] for r in history[:rb] if r.batch_ids}
    before = {r.batch_ids[0] for r in history[rb + 1 :] if r.batch_ids}
    assert {b for b, _ in committed} == {b for b in before | after if b.startswith("k")}  # every batch landed once
    assert after  # the worker kept committing after the rollback
    objects, events = _state(world_settings, written.branch)
    assert not [e for e, n in events.items() if n > 1]  # nothing doubled
    expected = {f"s{i}" for i in range(5)} | {b for b in after}
    assert {pk for _, pk in objects} == expected  # rolled back, then the later batches on top
    assert "x" not in {pk for _, pk in objects}
    assert OBJ  # the topic the worker's offsets belong to


def test_worker_meeting_a_landed_rollback_retries_on_top_of_it(
    written: WrittenWorld, api: Worlds, world_settings: Settings
) -> None:
    """The other interleaving: the rollback lands between the worker's read and its publish."""
    w = written.world
    written.commit("b1", [obj(w, "p1", "CREATE", 1)])
    target = written.heads[-1]
    written.commit("b2", [obj(w, "p2", "CREATE", 1)])
    landed: list[str | None] = []

    def rollback_first(cat: object, b: Batch, attempt: int) -> None:
        if attempt == 1:
            landed.append(api.rollback(w, f"{w}@{target}").hash)

    worker = BatchCommitter(world_settings, written.client, before_publish=rollback_first)
    out = worker.commit_batch(batch(w, "b3", [obj(w, "p3", "CREATE", 1)], 2))
    assert landed and landed[0] is not None
    assert out.attempts == 2  # its first publish conflicted with the rollback; it re-applied on the new head
    objects, events = _state(world_settings, written.branch)
    assert {pk for _, pk in objects} == {"p1", "p3"}
    assert sum(events.values()) == 2 and not [e for e, n in events.items() if n > 1]
    assert [r.kind for r in api.history(w, limit=2, counts=False)] == ["batch", "rollback"]


def test_a_rollback_whose_answer_is_lost_is_found_by_its_commit_id_and_made_once(
    written: WrittenWorld, api: Worlds, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = written.world
    written.commit("b1", [obj(w, "p1", "CREATE", 1)])
    target = written.heads[-1]
    written.commit("b2", [obj(w, "p2", "CREATE", 1)])
    landed = lose_first_answer(api.client, monkeypatch)
    out = api.rollback(w, f"{w}@{target}")  # no --force: only the lookup can save it
    assert out.hash is not None and landed == [out.hash]
    monkeypatch.undo()
    assert api.head(w).hash == out.hash and out.attempts == 1
    assert [r.kind for r in api.history(w, limit=2)] == ["rollback", "batch"]
    assert set(api.show(w).objects.column("object_pk").to_pylist()) == {"p1"}
