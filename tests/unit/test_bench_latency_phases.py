"""The bench's latency phases: one per offered rate, each with its own figures (issue 13: p99 at 5,000/s)."""

from __future__ import annotations

import argparse
import asyncio
import time

import pytest

from bench.__main__ import _add_overrides, _profile
from bench.harness import Mark, latency_of, phase_figures, ratios, ready_at
from bench.profiles import PROFILES
from bench.report import _cell


def _args(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    _add_overrides(ap)
    return ap.parse_args(list(argv))


def test_the_small_profile_measures_latency_at_1000_and_5000_events_per_second() -> None:
    small = PROFILES["small"]
    assert (small.latency_rate, *small.extra_latency_rates) == (1_000, 5_000)


def test_extra_rates_come_from_the_command_line_and_zero_turns_them_off() -> None:
    assert _profile(_args("--extra-latency-rates", "5000,10000")).extra_latency_rates == (5_000, 10_000)
    assert _profile(_args("--extra-latency-rates", "0")).extra_latency_rates == ()
    assert _profile(_args()).extra_latency_rates == (5_000,)
    with pytest.raises(SystemExit, match="not a list of integers"):
        _profile(_args("--extra-latency-rates", "fast"))


def test_latency_is_publish_to_visible_and_records_never_visible_count_as_lower_bounds() -> None:
    paced = {("t", 0, 1): (10_000, 100), ("t", 0, 2): (11_000, 100), ("t", 1, 1): (12_000, 100)}
    visible = {("t", 0, 1): 10.5, ("t", 0, 2): 10.0}  # the second was seen before its timestamp: clock skew
    latencies, censored = latency_of(paced, visible, finished_epoch=20.0)
    assert latencies == [0.5, 0.0, 8.0]
    assert censored == 1


def _fig(p99_first: float, p99_more: float) -> dict:
    phase = {"offered_rate": 5_000, "records": 50_000, "latency_s": {"p50": 1.0, "p99": p99_more}, "censored": 3}
    return {
        "events_per_s": 1.0,
        "latency_s": {"p50": 0.5, "p99": p99_first},
        "cpu_s_per_1k_events": 1.0,
        "peak_rss_mb": 1.0,
        "latency_phases": [{"offered_rate": 1_000, "latency_s": {"p99": p99_first}}, phase],
    }


def test_each_further_rate_is_reported_and_compared_with_the_ceiling_at_the_same_rate() -> None:
    r = ratios({"causeway": _fig(2.0, 3.0), "ceiling": _fig(1.0, 0.5)})
    assert r["causeway/ceiling"]["latency_p99"] == 2.0
    assert r["causeway/ceiling"]["latency_p99_at_5000"] == 6.0
    assert _cell(_fig(2.0, 3.0), "_more_latency") == "1.00 / 3.00 at 5,000/s (3 of 50000 not visible)"


def _exposition(counts: tuple[int, int, int], total: float) -> str:
    """A causeway_flush_wait_seconds exposition with cumulative counts at le=0.5, 1 and +Inf."""
    lines = [
        f'causeway_flush_wait_seconds_bucket{{le="{le}"}} {n}'
        for le, n in zip(("0.5", "1.0", "+Inf"), counts, strict=True)
    ]
    lines += [f"causeway_flush_wait_seconds_count {counts[-1]}", f"causeway_flush_wait_seconds_sum {total}"]
    return "\n".join(lines)


def test_a_phase_reports_only_what_the_workers_observed_during_it() -> None:
    before = Mark(100.0, 30.0, [_exposition((10, 10, 10), 1.0)])  # the preload: ten short waits
    after = Mark(110.0, 35.0, [_exposition((10, 12, 14), 5.0)])  # the phase: two waits in (0.5, 1], two above 1 s
    figures = phase_figures(before, after)
    assert (figures["wall_s"], figures["cpu_s"], figures["cpu_per_wall"]) == (10.0, 5.0, 0.5)
    wait = figures["flush_wait_s"]
    assert wait["count"] == 4
    assert wait["mean"] == 1.0
    assert 0.5 < wait["p50"] <= 1.0
    assert figures["commit_s"] == {}  # not exposed: nothing observed


class _GroupStableAt:
    """A group watch whose group turns Stable ``after`` seconds from now."""

    def __init__(self, after: float) -> None:
        self.stable_at = time.monotonic() + after

    async def wait_ready(self, members: int, timeout: float, alive: object) -> float:  # noqa: ASYNC109
        await asyncio.sleep(max(0.0, self.stable_at - time.monotonic()))
        return time.monotonic()


def test_the_clock_and_the_cpu_count_start_when_the_group_is_stable_even_if_health_answers_later() -> None:
    # A worker drains from its assignment on; /health answering later must not start the clock (nor
    # the CPU count read with it) late.
    watch = _GroupStableAt(0.05)
    health_done: list[float] = []
    read_at: list[float] = []

    def slow_health() -> None:
        time.sleep(0.4)
        health_done.append(time.monotonic())

    async def read() -> str:
        read_at.append(time.monotonic())
        return "cpu counters"

    ready, counters = asyncio.run(ready_at(watch, 1, lambda: True, [slow_health], read))
    assert counters == "cpu counters"
    assert health_done and ready < health_done[0] - 0.25
    assert watch.stable_at <= ready <= read_at[0] < health_done[0] - 0.25


def test_a_drain_is_polled_finely_enough_to_time_a_one_second_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: polled every 0.2 s, the ceiling's one-second drain read 1.0 or 1.2 s (40k or 49k
    events/s, never between), which moved the ratio by a fifth from run to run."""
    from bench import procs
    from bench.procs import GroupProgress, GroupWatch

    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(s: float) -> None:
        waits.append(s)
        await real_sleep(0)

    left = [3]

    async def progress() -> GroupProgress:
        left[0] = max(0, left[0] - 1)
        return GroupProgress({("t", 0): 10}, {("t", 0): 10 - left[0]})

    watch = GroupWatch.__new__(GroupWatch)
    watch.progress = progress  # type: ignore[method-assign]
    monkeypatch.setattr(procs.asyncio, "sleep", sleep)
    _, last = asyncio.run(watch.wait_drained(5.0))
    assert last.lag == 0 and waits and max(waits) <= 0.05
