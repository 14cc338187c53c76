"""The scaling curve's bookkeeping (issue 13): points of an axis, one row per point, the memory curve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import bench.__main__ as bench_main
from bench.__main__ import axis_points
from bench.harness import command_line, preload_rate
from bench.measure import thin
from bench.procs import ROOT, services_run_dir
from bench.profiles import SCALE_AXES
from bench.report import scale_markdown, scale_row
from streams.settings import Settings


def test_an_axis_runs_its_default_points_or_the_values_given_for_its_knob() -> None:
    assert axis_points("worlds", None) == SCALE_AXES["worlds"]
    assert axis_points("events", "50_000, 500000") == [{"events": 50_000}, {"events": 500_000}]
    assert axis_points("keys", "1000000") == [{"keys": 1_000_000}]
    with pytest.raises(SystemExit, match="not a list of integers"):
        axis_points("workers", "one,two")
    with pytest.raises(SystemExit, match="positive"):
        axis_points("workers", "0")


def _fig(events_per_s: float, cpu: float, load: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "events_per_s": events_per_s,
        "events_settled": 100_000,
        "capped": False,
        "stalled": False,
        "cpu_s_per_1k_events": cpu,
        "services_cpu_s_per_1k_events": {"kafka": 0.01, "nessie": 0.02},
        "peak_rss_per_process_mb": 700.0,
        "peak_rss_mb": 1400.0,
        "latency_offered_rate": 5_000,
        "latency_s": {"p50": 1.0, "p99": 2.5},
        "commit_s": {"mean": 0.8},
        "commits_per_1k_events": 1.2,
        "load_avg_1m": load,
        **extra,
    }


def _doc() -> dict[str, Any]:
    return {
        "run": {"id": "abcd1234", "machine": {"load_avg": [9.0]}},
        "contenders": {"ceiling": _fig(40_000, 0.02, [1.5, 2.0]), "causeway": _fig(20_000, 0.05, [2.0, 3.25])},
        "ratios": {"causeway/ceiling": {"events_per_s": 0.5}},
    }


def test_a_point_reports_both_contenders_the_ratio_and_the_load_from_the_first_start_to_the_last_end() -> None:
    row = scale_row({"workers": 2}, _doc())
    assert row["causeway_events_per_s"] == 20_000 and row["ceiling_events_per_s"] == 40_000
    assert row["ratio"] == 0.5
    assert row["load_1m"] == [1.5, 3.25]  # the ceiling ran first, causeway last: not the machine's end figure
    assert row["causeway_cpu_s"] == 5.0  # 0.05 s per 1k x 100k settled: the cost against the work
    assert row["worker_peak_rss_mb"] == 700.0 and row["all_workers_peak_rss_mb"] == 1400.0
    assert (row["causeway_p99_s"], row["ceiling_p99_s"], row["commit_mean_s"]) == (2.5, 2.5, 0.8)
    assert row["drained"]


def test_a_stalled_causeway_run_is_not_reported_as_drained() -> None:
    doc = _doc()
    doc["contenders"]["causeway"]["stalled"] = True
    assert not scale_row({"workers": 3}, doc)["drained"]


def test_the_table_has_one_row_per_point_and_as_many_cells_as_columns() -> None:
    table = scale_markdown("workers", [scale_row({"workers": 1}, _doc()), scale_row({"workers": 2}, _doc())])
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert len(lines) == 4
    assert len({line.count(" | ") for line in lines[:1] + lines[2:]}) == 1
    assert lines[1].count("---") == lines[0].count(" | ") + 1
    assert "| workers 2 | `abcd1234` | 1.50 → 3.25 | 20,000 | 40,000 | **0.50** |" in lines[3]


def test_a_failed_point_keeps_its_row_and_the_table_its_shape() -> None:
    table = scale_markdown("workers", [{"point": {"workers": 3}, "failed": "a process died"}])
    head, _, row = table.splitlines()[2:5]
    assert row.startswith("| workers 3 | **failed**: a process died |")
    assert row.count("|") == head.count("|")


def test_a_long_memory_curve_is_thinned_evenly_and_keeps_its_ends() -> None:
    assert thin(list(range(1000)), 5) == [0, 250, 500, 749, 999]
    assert thin([1, 2, 3], 60) == [1, 2, 3]


def test_the_command_of_a_run_is_recorded_as_typed() -> None:
    assert command_line(["/w/bench/__main__.py", "run", "--profile", "full"]) == "python -m bench run --profile full"
    assert command_line(["/w/cli/main.py", "run"]) is None


def test_scale_runs_each_point_with_its_knob_and_saves_the_axis_table(tmp_path: Path, monkeypatch: Any) -> None:
    seen: list[tuple[int, int]] = []

    def fake_run(profile: Any, args: Any) -> dict[str, Any]:
        seen.append((profile.events, profile.worlds))
        if profile.events == 7:
            raise RuntimeError("a process of group g died before the group drained")
        return _doc()

    monkeypatch.setattr(bench_main, "_run", fake_run)
    argv = ["scale", "--axis", "events", "--points", "7,500000", "--worlds", "3", "--out", str(tmp_path)]
    assert bench_main.main(argv) == 0
    assert seen == [(7, 3), (500_000, 3)]  # the curve profile, the point's knob, the other overrides kept
    (saved,) = tmp_path.glob("*-scale-events.json")
    rows = json.loads(saved.read_text())["points"]
    assert rows[0] == {"point": {"events": 7}, "failed": "a process of group g died before the group drained"}
    assert rows[1]["ratio"] == 0.5
    assert "| events 500,000 | `abcd1234` |" in saved.with_suffix(".md").read_text()


def test_the_services_cpu_is_read_from_the_pid_files_of_the_checkout_that_started_them() -> None:
    # A worktree's bench used its own .causeway/run, found no pid files and reported no services' CPU.
    main = Settings().replace(prometheus_sd_dir="/work/main/.causeway/run/prometheus-sd")
    assert services_run_dir(main) == Path("/work/main/.causeway/run")
    assert services_run_dir(Settings().replace(prometheus_sd_dir="")) == ROOT / ".causeway" / "run"


def test_only_what_settles_once_every_worker_is_in_is_timed() -> None:
    # Run 0f808919: the first of two workers drained 20,000 records alone while the second started;
    # the old figure was 20,000 / 0.2 s = 96k events/s.
    assert preload_rate(20_000, 19_950, 0.2) == (250.0, 50)
    assert preload_rate(50_000, 0, 16.1) == (3105.6, 50_000)
    assert preload_rate(10, 10, 0.0) == (0.0, 0)


def test_a_point_says_how_much_settled_before_every_worker_was_in() -> None:
    doc = _doc()
    doc["contenders"]["causeway"]["events_settled_before_ready"] = 19_950
    row = scale_row({"workers": 2}, doc)
    assert row["settled_before_ready"] == 19_950
    assert "(19,950 settled before every worker was in: not timed)" in scale_markdown("workers", [row])
