"""The commit probe's per-batch timings after the commit: settled, and the gap to the world's next commit."""

from __future__ import annotations

import pytest

from bench.commit_probe import next_commit_gaps, settled_after


def commit(batch: str, world: str, end: float, wall: float = 1.0, queue: float = 0.0) -> dict:
    return {"batch": batch, "world": world, "end": end, "wall": wall, "queue": queue, "stages": {}, "rows": 10}


def test_a_batch_is_settled_when_the_first_flush_of_its_world_ends_after_its_commit() -> None:
    records = [
        commit("a1", "wa", end=10.0),
        commit("b1", "wb", end=10.5),
        {"flushed": "wa", "end": 9.0},  # an earlier flush of wa
        {"flushed": "wb", "end": 10.7},
        {"flushed": "wa", "end": 10.2},
        {"flushed": "wa", "end": 12.0},
    ]
    assert settled_after(records) == pytest.approx({"a1": 0.2, "b1": 0.2})


def test_the_gap_runs_from_a_worlds_commit_returning_to_its_next_batch_submitted() -> None:
    records = [
        commit("a1", "wa", end=10.0),
        commit("b1", "wb", end=10.4),
        # submitted at 11.5 - 1.0 - 0.1 = 10.4: 0.4 s after a1 returned
        commit("a2", "wa", end=11.5, wall=1.0, queue=0.1),
        {"flushed": "wa", "end": 10.1},
    ]
    assert next_commit_gaps(records) == pytest.approx({"a2": 0.4})
