"""Replay planning, checkpoints and the into-world rewrite (pure)."""

from __future__ import annotations

import pytest

from cli.progress import render
from models.events import ChangeEvent, EntityKind, decode
from ops.replay.plan import (
    Checkpoint,
    OffsetRange,
    ReplayError,
    ReplaySpec,
    next_offset,
    parse_range,
    resolve_range,
    rewrite,
)
from tests.factories import change_event


def _event(world: str = "prod", etype: str = "Sensor", caused_by: str | None = "c-1") -> ChangeEvent:
    return change_event(
        "e-1",
        world=world,
        entity_type=etype,
        pk="pk-1",
        version=3,
        after={"a": 1},
        caused_by=caused_by,
        causal_order=7,
        occurred_at_ms=1_767_225_600_000,
        schema_version=1,
    )


def test_parse_range_forms() -> None:
    assert parse_range("3:100-200") == OffsetRange(None, 3, 100, 200)
    assert parse_range("objs.x/1:-50") == OffsetRange("objs.x", 1, None, 50)
    assert parse_range("0:7-") == OffsetRange(None, 0, 7, None)
    for bad in ("3", "a:1-2", "1:5-2", "1:2"):
        with pytest.raises(ReplayError):
            parse_range(bad)


def test_resolve_range_window_explicit_and_clamping() -> None:
    tp = ("t", 0)
    assert resolve_range(ReplaySpec(("t",)), tp, 10, 100, None, None) == (10, 100)
    window = ReplaySpec(("t",), from_ms=1, to_ms=2)
    assert resolve_range(window, tp, 10, 100, 40, 60) == (40, 60)
    assert resolve_range(window, tp, 10, 100, None, None) == (100, 100)  # nothing that late
    assert resolve_range(window, tp, 10, 100, 40, None) == (40, 100)
    explicit = ReplaySpec(("t",), ranges=(OffsetRange("t", 0, 5, 500),))
    assert resolve_range(explicit, tp, 10, 100, None, None) == (10, 100)  # clamped to the log
    assert explicit.partitions("t", {0, 1, 2}) == [0]
    assert ReplaySpec(("t",)).partitions("t", {2, 0, 1}) == [0, 1, 2]
    with pytest.raises(ReplayError):
        ReplaySpec(("t",), ranges=(OffsetRange(None, 9, 0, 1),)).partitions("t", {0})


def test_replay_id_is_stable_and_depends_on_every_option() -> None:
    a = ReplaySpec(("t",), worlds=("prod",))
    assert a.replay_id() == ReplaySpec(("t",), worlds=("prod",)).replay_id()
    assert a.replay_id() != ReplaySpec(("t",), worlds=("prod",), types=("Sensor",)).replay_id()
    assert a.replay_id() != ReplaySpec(("t",), worlds=("prod",), into_world="w").replay_id()


def test_filters() -> None:
    spec = ReplaySpec(("t",), worlds=("prod",), types=("Sensor",))
    assert spec.selects(_event())
    assert not spec.selects(_event(world="other"))
    assert not spec.selects(_event(etype="Pump"))


def test_checkpoint_roundtrip_resume_point_and_monotonic_advance() -> None:
    spec = ReplaySpec(("t",))
    cp = Checkpoint.start("r-1", spec, {("t", 0): (10, 20), ("t", 1): (0, 0)}, 1)
    assert cp.total == 10 and cp.left == 10 and not cp.complete
    cp.advance(("t", 0), 15)
    cp.advance(("t", 0), 12)  # never backwards
    assert cp.left == 5
    cp.add({"applied": 3})
    back = Checkpoint.from_json(cp.to_json())
    assert back.next == {"t/0": 15, "t/1": 0} and back.counters["applied"] == 3
    back.advance(("t", 0), 99)  # clamped to the end
    assert back.complete and back.remaining() == {}


def test_next_offset_holds_at_the_first_undone_offset() -> None:
    assert next_offset(120, None) == 120
    assert next_offset(120, 101) == 101


def test_rewrite_keeps_everything_but_the_world() -> None:
    ev = _event()
    moved = rewrite(ev, "whatif")
    assert moved.world_id == "whatif" and moved.key == "whatif::pk-1"
    assert (moved.event_id, moved.version, moved.caused_by, moved.after) == (ev.event_id, 3, "c-1", {"a": 1})
    assert decode(moved.encode(), moved.key.encode(), EntityKind.OBJECT) == moved


def test_progress_line_has_rate_and_eta() -> None:
    line = render("replay", 250, 1000, 5.0, width=10)
    assert "[##--------]" in line and "250/1,000" in line and "50/s" in line and "ETA 0:00:15" in line
    assert "ETA" not in render("scan", 10, None, 1.0)
