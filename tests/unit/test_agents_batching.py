"""Batch accumulation per world: flush on size or on age, with time passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.batching import BatchAccumulator, CpuLoad, busy_idle_age


def test_flush_on_size() -> None:
    acc: BatchAccumulator[int] = BatchAccumulator(max_events=3, max_seconds=10.0)
    assert not acc.add("w1", 1, now=0.0)
    assert not acc.add("w1", 2, now=0.1)
    assert acc.due(0.1) == []
    assert acc.add("w1", 3, now=0.2)
    assert acc.due(0.2) == ["w1"]
    assert acc.take_due(0.2) == {"w1": [1, 2, 3]}
    assert acc.size() == 0


def test_flush_on_age_counts_from_the_first_item() -> None:
    acc: BatchAccumulator[str] = BatchAccumulator(max_events=100, max_seconds=1.0)
    acc.add("w1", "a", now=5.0)
    acc.add("w1", "b", now=5.9)
    acc.add("w2", "c", now=5.5)
    assert acc.next_due_at() == 6.0
    assert acc.due(5.99) == []
    assert acc.due(6.0) == ["w1"]
    assert acc.due(6.5) == ["w1", "w2"]  # oldest first
    assert acc.take("w1") == ["a", "b"]
    acc.add("w1", "d", now=6.6)  # a new batch, a new age
    assert acc.due(7.0) == ["w2"]
    assert acc.next_due_at() == 6.5


def test_worlds_are_independent_and_take_all_empties() -> None:
    acc: BatchAccumulator[int] = BatchAccumulator(max_events=2, max_seconds=1.0)
    acc.add("a", 1, 0.0)
    acc.add("b", 2, 0.0)
    acc.add("a", 3, 0.0)
    assert acc.due(0.0) == ["a"]
    assert acc.size("a") == 2 and acc.size("b") == 1
    assert sorted(acc.worlds()) == ["a", "b"]
    assert acc.take_all() == {"a": [1, 3], "b": [2]}
    assert acc.next_due_at() is None
    assert acc.take("a") == []


def test_an_idle_intake_makes_every_buffered_batch_due() -> None:
    acc: BatchAccumulator[int] = BatchAccumulator(max_events=100, max_seconds=10.0)
    acc.add("w1", 1, now=0.0)
    acc.add("w2", 2, now=1.0)
    assert acc.due(2.0) == []
    assert acc.due(2.0, idle=True) == ["w1", "w2"]
    acc.take("w1")
    acc.take("w2")
    assert acc.due(2.0, idle=True) == []  # nothing buffered, nothing due
    # The applier passes the time it read before adding its items: with no idle minimum a batch
    # is due even when that time is before the batch began. Failed with the idle minimum's first
    # version (a batch "-0.6 ms old" waited for a tick that tests of the intake alone never run).
    acc.add("w3", 3, now=5.0)
    assert acc.due(4.9, idle=True) == ["w3"]


def test_bad_limits() -> None:
    with pytest.raises(ValueError):
        BatchAccumulator(max_events=0, max_seconds=1.0)
    with pytest.raises(ValueError):
        BatchAccumulator(max_events=1, max_seconds=-1.0)


@given(
    steps=st.lists(st.tuples(st.sampled_from(["w1", "w2", "w3"]), st.floats(0, 0.5, allow_nan=False)), max_size=60),
    max_events=st.integers(1, 8),
)
@settings(max_examples=100, deadline=None)
def test_flushing_due_batches_keeps_order_and_loses_nothing(steps: list[tuple[str, float]], max_events: int) -> None:
    acc: BatchAccumulator[int] = BatchAccumulator(max_events=max_events, max_seconds=1.0)
    now = 0.0
    out: dict[str, list[int]] = {}
    for i, (world, dt) in enumerate(steps):
        now += dt
        acc.add(world, i, now)
        for w, items in acc.take_due(now).items():
            assert 0 < len(items) <= max_events
            out.setdefault(w, []).extend(items)
        # nothing left behind is due
        assert acc.due(now) == []
    for w, items in acc.take_all().items():
        out.setdefault(w, []).extend(items)
    for world in {w for w, _ in steps}:
        assert out[world] == [i for i, (w, _) in enumerate(steps) if w == world]


def test_an_idle_intake_flushes_a_batch_only_once_it_is_the_idle_minimum_old() -> None:
    """Before: an idle intake made every buffered batch due at once, so at low rates a world's next
    commit started back to back with its last (the worker used a core at 1,000 events/s)."""
    acc: BatchAccumulator[int] = BatchAccumulator(max_events=100, max_seconds=10.0, idle_min_seconds=0.5)
    acc.add("w1", 1, now=0.0)
    acc.add("w2", 2, now=0.3)
    assert acc.due(0.4, idle=True) == []
    assert acc.due(0.5, idle=True) == ["w1"]
    assert acc.due(0.8, idle=True) == ["w1", "w2"]
    assert acc.due(0.8) == []  # not idle: the age flush still waits for max_seconds
    for i in range(3, 103):
        acc.add("w2", i, now=0.31)
    assert acc.due(0.31, idle=True) == ["w2"]  # full: due at once, idle or not


def test_a_busy_worker_stretches_the_idle_flush_towards_the_age_flush() -> None:
    """Before: an idle intake flushed at the idle minimum whatever the load, so at 5,000 events/s a
    worker near a full core paid a commit's fixed cost every half second per world."""
    assert busy_idle_age(0.5, 1.0, load=0.1, busy_load=0.8) == 0.5  # CPU to spare: the short wait
    assert busy_idle_age(0.5, 1.0, load=0.4, busy_load=0.8) == 0.5  # from half of busy_load on...
    assert busy_idle_age(0.5, 1.0, load=0.6, busy_load=0.8) == pytest.approx(0.75)  # ...a straight line
    assert busy_idle_age(0.5, 1.0, load=0.8, busy_load=0.8) == 1.0
    assert busy_idle_age(0.5, 1.0, load=1.7, busy_load=0.8) == 1.0  # never past the age flush
    assert busy_idle_age(0.5, 1.0, load=1.7, busy_load=0.0) == 0.5  # 0: off
    acc: BatchAccumulator[int] = BatchAccumulator(max_events=100, max_seconds=1.0, idle_min_seconds=0.5)
    acc.add("w1", 1, now=0.0)
    assert acc.due(0.5, idle=True) == ["w1"]
    assert acc.stretch(0.9, 0.8) == 1.0
    assert acc.due(0.5, idle=True) == []
    assert acc.due(0.99, idle=True) == []
    assert acc.due(1.0, idle=True) == ["w1"]
    assert acc.stretch(0.2, 0.8) == 0.5  # the load fell: the short wait again
    assert acc.due(0.5, idle=True) == ["w1"]


def test_cpu_load_is_the_smoothed_share_of_a_core_between_readings() -> None:
    load = CpuLoad(window_s=3.0, min_step_s=0.5)
    assert load.observe(10.0, 1.0) == 0.0  # the first reading only starts the clock
    assert load.observe(10.2, 1.2) == 0.0  # too close to say anything
    assert load.observe(13.0, 3.7) == pytest.approx(0.9)  # a whole window at 0.9 of a core
    for i in range(1, 20):
        last = load.observe(13.0 + i, 3.7 + 0.2 * i)  # then 0.2 of a core, a second at a time
    assert last == pytest.approx(0.2, abs=0.01)
    assert load.observe(40.0, 3.0) == pytest.approx(0.2 * (1 - 1.0), abs=0.2)  # a clock going back reads as idle
    with pytest.raises(ValueError):
        CpuLoad(window_s=0)


def test_the_idle_minimum_never_delays_past_the_age_flush() -> None:
    acc: BatchAccumulator[int] = BatchAccumulator(max_events=100, max_seconds=0.2, idle_min_seconds=5.0)
    assert acc.idle_min_seconds == 0.2
    acc.add("w1", 1, now=0.0)
    assert acc.due(0.2, idle=True) == ["w1"]
    with pytest.raises(ValueError):
        BatchAccumulator(max_events=1, max_seconds=1.0, idle_min_seconds=-0.1)


def test_the_rest_of_a_backlog_is_due_at_once_when_the_intake_catches_up() -> None:
    """Before: a batch started while the intake was behind waited the idle minimum once it caught
    up, though nothing more was coming for it (0.2-0.5 s added to the end of every catch-up)."""
    acc: BatchAccumulator[int] = BatchAccumulator(max_events=100, max_seconds=10.0, idle_min_seconds=0.5)
    acc.add("w1", 1, now=1.9)  # the rest of the backlog
    acc.add("w2", 2, now=2.1)  # a trickle after the intake caught up at 2.0
    assert acc.due(2.2, idle=True) == []  # no catch-up known: the idle minimum holds both
    assert acc.due(2.2, idle=True, caught_up_at=2.0) == ["w1"]
    assert acc.due(2.2, idle=False, caught_up_at=2.0) == []  # reading again: batches grow
    assert acc.due(2.5, idle=True, caught_up_at=2.0) == ["w1"]
    assert acc.due(2.6, idle=True, caught_up_at=2.0) == ["w1", "w2"]
