"""Offset reset plans and the active-group refusal (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from ops.offsets.plan import (
    GroupState,
    LagRow,
    Member,
    ResetRefused,
    check_resettable,
    parse_offset_targets,
    plan_reset,
)

TPS = [("t", 0), ("t", 1)]
KW: dict[str, Any] = {
    "committed": {("t", 0): 50, ("t", 1): None},
    "starts": {("t", 0): 10, ("t", 1): 0},
    "ends": {("t", 0): 100, ("t", 1): 30},
}


def test_refused_while_members_are_active() -> None:
    check_resettable(GroupState("g", "Empty", ()))
    with pytest.raises(ResetRefused, match="1 active member"):
        check_resettable(GroupState("g", "Stable", (Member("m-1", "causeway", "/127.0.0.1"),)))


def test_plans() -> None:
    assert [r.target for r in plan_reset("earliest", TPS, **KW)] == [10, 0]
    latest = plan_reset("latest", TPS, **KW)
    assert [r.target for r in latest] == [100, 30] and latest[0].delta == 50 and latest[1].delta is None
    by_time = plan_reset("timestamp", TPS, by_time={("t", 0): 70, ("t", 1): None}, **KW)
    assert [r.target for r in by_time] == [70, 30]
    explicit = plan_reset("offset", TPS, offsets={("t", 0): 5, ("t", 1): 99}, **KW)
    assert [r.target for r in explicit] == [10, 30]  # clamped to the log, like Kafka's tool
    with pytest.raises(ResetRefused):
        plan_reset("offset", TPS, offsets={("t", 0): 5}, **KW)
    with pytest.raises(ResetRefused):
        plan_reset("middle", TPS, **KW)


def test_offset_targets() -> None:
    assert parse_offset_targets(["7"], TPS) == {("t", 0): 7, ("t", 1): 7}
    assert parse_offset_targets(["1:9", "t/0:3"], TPS) == {("t", 1): 9, ("t", 0): 3}
    for bad in ("x", "5:x", "u/0:1"):
        with pytest.raises(ResetRefused):
            parse_offset_targets([bad], TPS)


def test_lag() -> None:
    assert LagRow("t", 0, 40, 10, 100).lag == 60
    assert LagRow("t", 0, None, 10, 100).lag == 90  # never committed: lags from the log start
