"""The timeline probe's summary: how much of a drain the intake and the flushes overlapped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.timeline_probe import Span, load, main, summary


def drain(first_flush_at: float) -> list[Span]:
    """Polls 0-1, 1-2, 2-3 s; flushes of 1 s from ``first_flush_at`` on, back to back, till 4 s."""
    spans = [Span("poll", float(i), float(i + 1), 100) for i in range(3)]
    t = first_flush_at
    while t < 4.0:
        spans.append(Span("flush", t, min(4.0, t + 1.0), 50, "w"))
        t += 1.0
    return spans


def test_a_pipeline_that_flushes_early_overlaps_its_intake() -> None:
    late, early = summary(drain(2.5)), summary(drain(0.5))
    assert late["first_flush_after_s"] == 2.5 and early["first_flush_after_s"] == 0.5
    assert late["overlap_s"] == 0.5 and early["overlap_s"] == 2.5
    assert late["tail_s"] == early["tail_s"] == 1.0
    assert late["idle_s"] == early["idle_s"] == 0.0


def test_a_wait_between_the_last_poll_and_the_last_flush_is_idle_time() -> None:
    spans = [Span("poll", 0.0, 1.0, 10), Span("flush", 0.5, 1.2, 5, "w"), Span("flush", 1.7, 2.0, 5, "w")]
    figures = summary(spans)
    assert figures["idle_s"] == 0.5 and figures["tail_s"] == 1.0 and figures["flushes"] == 2
    assert summary(spans, until=1.5)["flushes"] == 1
    assert summary([Span("poll", 0.0, 1.0, 10)]) == {}
    later = summary([*spans, Span("poll", 2.5, 2.6, 1)])  # a poll after the last flush: no tail
    assert later["tail_s"] == 0.0 and later["idle_s"] == 1.0 and later["span_s"] == 2.6
    assert summary([*spans, Span("poll", 2.5, 2.6, 1)], min_poll=2) == figures


def test_the_report_reads_what_the_probe_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps([vars(s) for s in drain(0.5)]))
    assert load(str(path)) == drain(0.5)
    main([str(path), "--json"])
    assert json.loads(capsys.readouterr().out)["overlap_s"] == 2.5


def test_a_probe_file_is_replaced_whole(tmp_path: Path) -> None:
    from bench.probe_file import write_json

    path = tmp_path / "p.json"
    write_json(str(path), [1])
    write_json(str(path), {"a": [2, 3]})
    assert json.loads(path.read_text()) == {"a": [2, 3]} and [p.name for p in tmp_path.iterdir()] == ["p.json"]
