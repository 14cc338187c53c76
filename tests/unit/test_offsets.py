"""Offset tracking: the committable offset never passes an offset that is consumed and not done."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.offsets import (
    OffsetTracker,
    format_ranges,
    in_ranges,
    merge_ranges,
    parse_ranges,
    to_ranges,
)

TP = ("onto.changes.objects", 3)


def test_in_order_done_advances_past_each_offset() -> None:
    t = OffsetTracker()
    for o in range(5):
        assert t.consumed(TP, o)
    assert t.committable(TP) == 0
    t.done(TP, 0)
    t.done(TP, 1)
    assert t.committable(TP) == 2
    for o in (2, 3, 4):
        t.done(TP, o)
    assert t.committable(TP) == 5
    assert t.in_flight(TP) == 0


def test_a_parked_offset_holds_its_partition_back() -> None:
    t = OffsetTracker()
    for o in range(800, 1000):
        t.consumed(TP, o)
    for o in range(800, 1000):
        if o != 850:
            t.done(TP, o)
    assert t.committable(TP) == 850  # the trap in the brief: not 1000
    t.done(TP, 850)
    assert t.committable(TP) == 1000


def test_gaps_never_seen_do_not_hold_back() -> None:
    t = OffsetTracker()
    for o in (10, 13, 20):  # 11, 12, 14..19: transaction markers or compacted away
        t.consumed(TP, o)
    t.done(TP, 13)
    assert t.committable(TP) == 10
    t.done(TP, 10)
    assert t.committable(TP) == 20
    t.done(TP, 20)
    assert t.committable(TP) == 21


def test_assign_makes_the_start_position_committable() -> None:
    t = OffsetTracker()
    assert t.committable(TP) is None
    t.assign(TP, 42)
    assert t.committable(TP) == 42
    assert not t.consumed(TP, 41)  # below the position: already settled
    assert t.consumed(TP, 42)
    assert t.committable(TP) == 42


def test_refetch_and_double_done_are_harmless() -> None:
    t = OffsetTracker()
    t.consumed(TP, 0)
    t.consumed(TP, 1)
    assert not t.consumed(TP, 0)
    assert t.done(TP, 1)
    assert not t.done(TP, 1)
    assert t.committable(TP) == 0


def test_done_on_an_unread_offset_is_an_error() -> None:
    t = OffsetTracker()
    t.consumed(TP, 5)
    with pytest.raises(ValueError, match="never consumed"):
        t.done(TP, 6)


def test_revoke_forgets_and_ignores_late_dones() -> None:
    other = ("onto.changes.links", 0)
    t = OffsetTracker()
    t.consumed(TP, 7)
    t.consumed(other, 1)
    t.revoke(TP)
    assert not t.done(TP, 7)
    assert t.committable(TP) is None
    assert t.partitions() == [other]
    assert t.committable_all() == {other: 1}
    assert t.in_flight() == 1


@given(
    offsets=st.lists(st.integers(0, 200), min_size=1, max_size=60, unique=True).map(sorted),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_committable_is_the_first_consumed_offset_not_done(offsets: list[int], data: st.DataObject) -> None:
    t = OffsetTracker()
    for o in offsets:
        t.consumed(TP, o)
    order = data.draw(st.permutations(offsets))
    cut = data.draw(st.integers(0, len(order)))
    done = set(order[:cut])
    for o in order[:cut]:
        t.done(TP, o)
    pending = [o for o in offsets if o not in done]
    expected = pending[0] if pending else offsets[-1] + 1
    assert t.committable(TP) == expected
    # never passes an offset that is neither done nor a gap
    assert all(o >= expected for o in pending)


def test_range_helpers() -> None:
    assert to_ranges([5, 3, 4, 9, 4, 12, 10]) == [(3, 6), (9, 11), (12, 13)]
    assert merge_ranges([(0, 2), (5, 6)], [(2, 3), (4, 5), (9, 9)]) == [(0, 3), (4, 6)]
    ranges = to_ranges([1, 2, 3, 7])
    assert [o for o in range(10) if in_ranges(ranges, o)] == [1, 2, 3, 7]
    assert format_ranges(ranges) == "1-3,7"
    assert parse_ranges("1-3,7") == ranges
    assert parse_ranges("") == []
    with pytest.raises(ValueError):
        parse_ranges("5-2")


@given(st.sets(st.integers(0, 500), max_size=80))
def test_ranges_roundtrip_exactly(offsets: set[int]) -> None:
    ranges = to_ranges(offsets)
    assert parse_ranges(format_ranges(ranges)) == ranges
    assert {o for s, e in ranges for o in range(s, e)} == offsets
    assert all(in_ranges(ranges, o) == (o in offsets) for o in range(-1, 502))
