"""Fault injection: kill -9 workers at each point of a flush and at random times, restart, and
compare the branches with the model. Every kill is a real SIGKILL of a worker process."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents.faults import POINTS
from cli.workload import Record, Workload, generate
from models.deadletter import DeadLetter
from models.events import EntityKind
from sinks.catalog import NessieCatalog
from tests.integration.pipeline import Pipeline, assert_matches_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def _killed_or_drained(pipe: Pipeline, worker: Any, timeout: float = 180.0) -> bool:  # noqa: ASYNC109
    """Until ``worker`` dies at its fault point (True) or the group has drained the backlog without it
    getting there (False: it had fewer flushes left; it is stopped). Neither within ``timeout``
    seconds while the lag stands still is a stall, and fails with the worker's log."""
    deadline = time.monotonic() + timeout
    lag = await pipe.lag()
    while time.monotonic() < deadline:
        if not worker.alive():
            assert worker.proc.returncode == -signal.SIGKILL, worker.log.read_text()[-2000:]
            return True
        now = await pipe.lag()
        if now == 0:
            pipe.kill(worker, signal.SIGTERM)
            return False
        if now < lag:
            lag, deadline = now, time.monotonic() + timeout  # progress: not a stall
        await asyncio.sleep(0.5)
    raise AssertionError(f"stalled: lag {lag} for {timeout:.0f}s, worker alive; log:\n{worker.log.read_text()[-3000:]}")


@pytest.mark.parametrize("point", POINTS)
async def test_kill_at_each_flush_point(point: str, unique: str, tmp_path: Path) -> None:
    pipe = await Pipeline.create(unique, tmp_path, batch_max_events=150, batch_max_seconds=0.3)
    try:
        wl = generate(pipe.params(events=1500, worlds=2, keys=60, seed=31, duplicate_rate=0.05))
        await pipe.publish(wl.records)
        kills = drained = 0
        # The n-th restart dies at its n-th pass of the point. With the batch intake one worker may
        # drain the rest of the backlog in fewer flushes than that: then it is stopped and counted,
        # not waited for; a worker that neither dies nor moves the lag fails the test as a stall.
        for nth in (1, 2, 3):
            worker = pipe.start_worker(fault=f"{point}:{nth}", wait=False)
            killed = await _killed_or_drained(pipe, worker)
            kills, drained = kills + killed, drained + (not killed)
            print(
                f"restart {nth}: {'killed at pass ' + str(nth) if killed else 'drained the backlog first'}", flush=True
            )
        assert kills >= 1
        pipe.start_worker()
        await pipe.wait_drained(timeout=180)
        assert_matches_model(pipe, wl.valid_events)
        print(f"fault point {point}: {kills} kills, {drained} restart(s) drained first, model matched")
    finally:
        pipe.stop_all()


async def test_kill_between_a_confirmed_dead_letter_and_its_decision(unique: str, tmp_path: Path) -> None:
    """SIGKILL right after the broker confirmed a batch of letters, before their decisions are
    confirmed in Redis, three times: the next owner finds them pending, reads the DLQ, and settles
    them. Every origin ends with exactly one letter, every valid event on its branch once."""
    pipe = await Pipeline.create(unique, tmp_path, batch_max_events=150, batch_max_seconds=0.3)
    try:
        wl = generate(pipe.params(events=900, worlds=2, keys=60, seed=7, duplicate_rate=0.05, bad_rate=0.05))
        await pipe.publish(wl.records)
        kills = 0
        for _ in range(3):
            worker = pipe.start_worker(fault="after-dead-letter:1", wait=False)
            kills += await _killed_or_drained(pipe, worker)
        assert kills >= 1
        pipe.start_worker()
        await pipe.wait_drained(timeout=180)
        outcome = check_branches(pipe, wl, set(), await pipe.dead_letters())
        print(f"after-dead-letter: {kills} kills; {dict(outcome)}; one letter per origin")
    finally:
        pipe.stop_all()


async def test_random_kills(unique: str, tmp_path: Path) -> None:
    rng = random.Random(unique)
    pipe = await Pipeline.create(unique, tmp_path, batch_max_events=200, batch_max_seconds=0.3)
    try:
        wl = generate(pipe.params(events=3000, worlds=3, keys=80, seed=41, duplicate_rate=0.05))
        third = len(wl.records) // 3
        await pipe.publish(wl.records[:third])
        kills = 0
        for i in range(11):
            worker = pipe.start_worker()
            if i == 3:
                await pipe.publish(wl.records[third : 2 * third])
            if i == 7:
                await pipe.publish(wl.records[2 * third :])
            await asyncio.sleep(rng.uniform(0.2, 2.5))
            pipe.kill(worker)
            kills += 1
        pipe.start_worker()
        await pipe.wait_drained(timeout=240)
        assert_matches_model(pipe, wl.valid_events)
        print(f"random kills: {kills} kills, model matched")
    finally:
        pipe.stop_all()


# --- randomized: several workers join, leave and die while every kind of input flows (issue 12) ------


def _orphans(pipe: Pipeline, n: int) -> tuple[list[Record], set[str]]:
    """Events whose cause is never published (they and their own effects must be dead-lettered)."""
    records, ids = [], set()
    for i in range(n):
        first = f"{pipe.unique}-orphan-{i}"
        second = f"{first}-effect"
        for eid, pk, cause in ((first, f"orph{i}a", f"{pipe.unique}-never-{i}"), (second, f"orph{i}b", first)):
            doc = {
                "event_id": eid,
                "world_id": "prod",
                "object_type": "Sensor",
                "object_pk": pk,
                "change_type": "CREATE",
                "after_properties": {"n": i},
                "version": 1,
                "occurred_at": 0,
                "caused_by": cause,
            }
            records.append(Record(EntityKind.OBJECT, f"prod::{pk}".encode(), orjson.dumps(doc), None))
            ids.add(eid)
    return records, ids


def _log(pipe: Pipeline, world: str) -> list[dict[str, Any]]:
    """The world's entity_events rows, each with ``commit``: the index of its batch's commit on the branch."""
    from models.worlds import WorldNaming
    from sinks.committer import PROP_BATCH
    from sinks.nessie import SyncNessieClient

    s = pipe.settings
    branch = WorldNaming(s.prod_world, s.main_branch).branch(world)
    with SyncNessieClient(s.nessie_url) as client:
        entries = [e for page in client.history(branch, max_records=200) for e in page]
    order = {e.properties[PROP_BATCH]: i for i, e in enumerate(reversed(entries)) if PROP_BATCH in e.properties}
    catalog = NessieCatalog.from_settings(s, s.main_branch).at(branch)
    rows = catalog.load_table((s.namespace, "entity_events")).scan().to_arrow().to_pylist()
    for row in rows:
        row["commit"] = order[row["batch_id"]]
    return rows


def _fold(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Objects and links a branch must hold given its applied events: the highest version wins."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["kind"], r["entity_pk"])
        if r["applied"] and (key not in best or r["version"] > best[key]["version"]):
            best[key] = r
    out: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    for (kind, pk), r in best.items():
        if r["change_type"] != "DELETE":
            props = orjson.loads(r["after_properties"]) if r["after_properties"] else None
            out[kind != "object"][pk] = {"type": r["entity_type"], "version": r["version"], "properties": props}
    return out


def check_branches(pipe: Pipeline, wl: Workload, orphans: set[str], letters: list[DeadLetter]) -> Counter[str]:
    """What every run must show, read from Nessie, Iceberg and the dead-letter topic only.

    Every valid event took effect exactly once on its world's branch, or did not take effect and has
    a dead letter with a reason (a late cause may miss the causal timeout while its partition moves
    between workers: then the effect is dead-lettered, which is correct). Causes no later than their
    effects; each key's versions in commit order; projections equal the fold of the applied events;
    every bad record dead-lettered; an event whose cause is never published is dead-lettered.

    Exactly one dead letter per origin (topic, partition, offset): a record dead-lettered before a
    crash and redelivered (its offset was not committed) is settled by its recorded decision, never
    decided again. No origin has both a letter and a row on its branch; a row logged as not applied
    (stale) has its one ``stale-version`` letter at the same origin. An event that took effect may
    have a letter only at *another* origin: a producer-retry copy is a record of its own, decided on
    its own (counted in the returned summary); a ``stale-version`` letter for it never.
    """
    by_origin: dict[tuple[str, int, int], list[DeadLetter]] = {}
    for d in letters:
        assert d.reason, f"dead letter without a reason: {d}"
        by_origin.setdefault((d.topic, d.partition, d.offset), []).append(d)
    twice = {o: sorted(d.reason for d in same) for o, same in by_origin.items() if len(same) > 1}
    assert not twice, f"origins dead-lettered more than once: {twice}"
    reasons: dict[tuple[str | None, str | None], set[str]] = {}
    for d in letters:
        reasons.setdefault((d.world_id, d.event_id), set()).add(d.reason)
    outcome: Counter[str] = Counter()
    for world in sorted({e.world_id for e in wl.valid_events}):
        rows = _log(pipe, world)
        ids = Counter(str(r["event_id"]) for r in rows)
        assert not [i for i, n in ids.items() if n > 1], f"{world}: an event was logged twice"
        applied = [r for r in rows if r["applied"]]
        for r in rows:
            origin = (r["source_topic"], r["source_partition"], r["source_offset"])
            here = [d.reason for d in by_origin.get(origin, [])]
            if r["applied"]:
                assert not here, f"{world}: {r['event_id']} took effect and its origin {origin} has a letter {here}"
            else:  # logged stale: its key had moved on when it was committed
                assert here == ["stale-version"], f"{world}: stale row {r['event_id']} at {origin}: letters {here}"
                outcome["stale"] += 1
        commit = {str(r["event_id"]): int(r["commit"]) for r in applied}
        for r in applied:
            cause = r["caused_by"]
            if cause is not None:
                assert cause in commit, f"{world}: {r['event_id']} took effect, its cause {cause} never did"
                assert commit[cause] <= commit[r["event_id"]], f"{world}: {r['event_id']} committed before its cause"
        last: dict[tuple[str, str, str], int] = {}
        for r in sorted(applied, key=lambda r: (r["commit"], r["version"])):
            key = (r["kind"], r["entity_type"], r["entity_pk"])
            assert last.get(key, -1) < r["version"], f"{world}: {key} versions out of commit order"
            last[key] = r["version"]
        for ev in (e for e in wl.valid_events if e.world_id == world):
            got = reasons.get((world, ev.event_id), set())
            if ev.event_id in commit:
                assert "stale-version" not in got, f"{world}: {ev.event_id} took effect and was dead-lettered stale"
                outcome["applied" if not got else f"applied from a copy, another copy {'/'.join(sorted(got))}"] += 1
            else:
                assert got, f"{world}: {ev.event_id} neither took effect nor was dead-lettered"
                outcome["dead-lettered " + "/".join(sorted(got))] += 1
        state = pipe.state(world)
        objects, links = _fold(rows)
        assert state.objects == objects, f"{world}: entity_common is not the fold of the applied events"
        assert state.links == links, f"{world}: entity_edge is not the fold of the applied events"
    prod = {str(r["event_id"]) for r in _log(pipe, "prod") if r["applied"]} if orphans else set()
    for eid in orphans:
        assert eid not in prod, f"{eid} took effect without its cause"
        assert reasons.get(("prod", eid)) == {"cause-missing"}, f"{eid}: {reasons.get(('prod', eid))}"
    bad = [o for o, same in by_origin.items() if any(d.event_id is None or d.event_id.startswith("bad-") for d in same)]
    assert len(bad) == wl.bad_count, f"{len(bad)} dead-lettered origins for {wl.bad_count} bad records"
    return outcome


async def _drain_supervised(pipe: Pipeline, workers: list[Any], n: int = 3, timeout: float = 300.0) -> None:  # noqa: ASYNC109
    """Wait until drained while keeping ``n`` workers alive, as a supervisor would: on a loaded box a
    worker can exit at start-up (its preflight gives each service 5 s), and a run must not hang on that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while len([w for w in workers if w.alive()]) < n:
            workers.append(pipe.start_worker(wait=False))
        if await pipe.lag() == 0:
            return
        await asyncio.sleep(1.0)
    await pipe.wait_drained(timeout=1)  # raises with the workers' logs


SEEDS = [int(s) for s in os.environ.get("CAUSEWAY_FAULT_SEEDS", "1").split(",")]


@pytest.mark.timeout(900)  # its own waits (up to 300 s drained) decide, not the suite's 300 s default
@pytest.mark.parametrize("seed", SEEDS)
async def test_workers_join_leave_and_die_at_random(seed: int, unique: str, tmp_path: Path) -> None:
    """At least 3 workers; each step starts one, stops one (SIGTERM) or kills one (SIGKILL), at random
    moments while late, cross-partition and missing causes, duplicates at other offsets and bad
    records flow. CI runs one seed; set CAUSEWAY_FAULT_SEEDS=1,2,...,20 for the long version."""
    rng = random.Random(seed)
    pipe = await Pipeline.create(unique, tmp_path, batch_max_events=150, batch_max_seconds=0.3, causal_timeout_s=15.0)
    try:
        wl = generate(pipe.params(events=2400, worlds=2, keys=60, seed=seed, duplicate_rate=0.05, bad_rate=0.02))
        orphan_records, orphans = _orphans(pipe, 3)
        records = list(wl.records)
        for r in orphan_records:
            records.insert(rng.randrange(len(records)), r)
        chunks = [records[i * len(records) // 4 : (i + 1) * len(records) // 4] for i in range(4)]
        workers = [pipe.start_worker(wait=False) for _ in range(3)]
        actions: list[str] = []
        for step in range(12):
            if step % 3 == 0 and chunks:
                await pipe.publish(chunks.pop(0))
            await asyncio.sleep(rng.uniform(0.3, 3.0))
            alive = [w for w in workers if w.alive()]
            roll = rng.random()
            if len(alive) < 3 or roll < 0.3:
                workers.append(pipe.start_worker(wait=False))
                actions.append("join")
            elif roll < 0.5:
                pipe.kill(rng.choice(alive), signal.SIGTERM)
                actions.append("leave")
            else:
                pipe.kill(rng.choice(alive))
                actions.append("kill")
        for chunk in chunks:
            await pipe.publish(chunk)
        await _drain_supervised(pipe, workers)
        outcome = check_branches(pipe, wl, orphans, await pipe.dead_letters())
        print(f"seed {seed}: {' '.join(actions)}; {len(pipe.workers)} worker processes; {dict(outcome)}; checks held")
    finally:
        pipe.stop_all()
