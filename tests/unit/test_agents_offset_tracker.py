"""Offset tracking: the committable offset never passes an offset that is consumed and not done."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.offset_tracker import (
    Arrival,
    OffsetTracker,
    arrival,
    arrival_at,
    format_ranges,
    in_ranges,
    merge_ranges,
    parse_ranges,
    to_ranges,
)
from models.events import ChangeEvent, decode
from sinks.committed_offsets import Source
from tests.fakes import event

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


def test_a_record_handed_over_after_its_partition_was_revoked_does_not_recreate_it() -> None:
    """Issue 12 case 1: P@10 parked, P@11 done; revoke; a buffered old-generation P@12 arrives late."""
    t = OffsetTracker()
    for o in (10, 11):
        t.consumed(TP, o)
    t.done(TP, 11)
    t.revoke(TP, fence=True)
    assert not t.consumed(TP, 12)  # refused: not assigned in the current generation
    assert t.committable_all() == {}  # so no floor can be derived from it
    t.assign(TP)
    # The new generation re-reads from the committed offset: 10 is taken again, not skipped.
    assert [t.consumed(TP, o) for o in (10, 11, 12)] == [True, True, True]
    t.done(TP, 11)
    t.done(TP, 12)
    assert t.committable(TP) == 10


def test_records_of_another_generation_are_refused() -> None:
    t = OffsetTracker()
    t.assign(TP, 5, generation=3)
    assert not t.consumed(TP, 7, generation=2)  # fetched before the rebalance
    assert t.committable(TP) == 5
    assert t.consumed(TP, 5, generation=3)
    assert t.consumed(TP, 6)  # an intake that does not tag generations is not checked
    t.revoke(TP)  # without a fence: a consumer that rewinds itself starts again on its next record
    assert t.consumed(TP, 5)


def test_faust_commits_past_an_unacked_offset_right_after_the_committed_one() -> None:
    """Faust's ``_new_offset`` off-by-one (issue 12): committed=C, C unacked, C+1 acked → commits C+2.

    Its head-gap check is ``min(acked) - committed > 1``, so a one-offset gap at the head is stepped
    over (it stands in for a transaction marker, since Faust records no gap after a seek). The
    applier is safe because it acks each partition in offset order from the first record of the
    assignment: C+1 is never acked while C, consumed in the same assignment, is not. An intake that
    commits offsets itself must commit ``OffsetTracker.committable`` and nothing derived from acks.
    """
    from types import SimpleNamespace

    from faust.transport.consumer import Consumer
    from intervaltree import IntervalTree

    def new_offset(committed: int, acked: list[int]) -> int | None:
        fake = SimpleNamespace(
            _acked={TP: list(acked)},
            _gap={TP: IntervalTree()},
            _committed_offset={TP: committed},
            _acked_index={TP: set(acked)},
        )
        return Consumer._new_offset(fake, TP)  # type: ignore[arg-type]

    assert new_offset(10, [11]) == 12  # offset 10 skipped although it was never acked
    assert new_offset(10, [12]) is None  # a two-offset gap is respected
    assert new_offset(10, [10, 11]) == 12  # in-order acks, as the applier gives them

    # The tracker never lets an ack above an unsettled consumed offset through.
    t = OffsetTracker()
    t.assign(TP, 10)
    t.consumed(TP, 10)
    t.consumed(TP, 11)
    t.done(TP, 11)
    assert t.committable(TP) == 10


def test_an_arrival_carries_the_source_the_committer_records() -> None:
    """One record says where an event was read: the committer's ``Source`` is the arrival's own."""
    from sinks.committed_offsets import Source
    from sinks.committer import Batch
    from tests.factories import change_event

    arrival = Arrival(change_event("e1", world="prod"), Source("onto.changes.objects", 3, 17))
    assert (arrival.topic, arrival.partition, arrival.offset, arrival.tp) == (
        "onto.changes.objects", 3, 17, ("onto.changes.objects", 3),
    )  # fmt: skip
    batch = Batch.from_sources("prod", "b1", [(arrival.event, arrival.source)])
    assert batch.sources == [arrival.source]


def test_the_intakes_arrival_is_the_frozen_arrival_with_its_ref() -> None:
    ev = decode(event(7, world="w-2"))
    assert isinstance(ev, ChangeEvent)
    src = Source("t", 3, 41)
    fast, slow = arrival(ev, src), Arrival(ev, src)
    assert type(fast) is Arrival and fast == slow and repr(fast) == repr(slow)
    assert fast.ref == slow.ref == ("w-2", "e7") and fast.tp == ("t", 3) and fast.offset == 41
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.ref = ("x", "y")  # type: ignore[misc]


def test_the_intakes_arrival_at_builds_the_frozen_arrival_and_source() -> None:
    ev = decode(event(7, world="w-2"))
    assert isinstance(ev, ChangeEvent)
    fast, slow = arrival_at(ev, "t", 3, 41), Arrival(ev, Source("t", 3, 41))
    assert type(fast) is Arrival and type(fast.source) is Source
    assert fast == slow and repr(fast) == repr(slow) and hash(fast.source) == hash(slow.source)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.source.offset = 5  # type: ignore[misc]


@given(
    offsets=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60)), min_size=1, max_size=60, unique=True),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_done_all_equals_done_one_by_one(offsets: list[tuple[int, int]], data: st.DataObject) -> None:
    """A commit's sources settled in one call (runs of one partition, any order, a revoked one
    among them) leave every partition as ``done`` one source at a time does."""
    one, many = OffsetTracker(), OffsetTracker()
    tps = [("t", p) for p in range(3)]
    for t in (one, many):
        for p, o in sorted(offsets):
            t.consumed(tps[p], o)
        t.revoke(tps[2])
    order = data.draw(st.permutations(offsets))
    cut = data.draw(st.integers(0, len(order)))
    sources = [Source("t", p, o) for p, o in order[:cut]]
    for src in sources:
        one.done(src.tp, src.offset)
    many.done_all(sources)
    assert [one.committable(tp) for tp in tps] == [many.committable(tp) for tp in tps]
    assert [one.in_flight(tp) for tp in tps] == [many.in_flight(tp) for tp in tps]
    many.done_all(sources)  # again: idempotent, as ``done`` is
    assert [one.committable(tp) for tp in tps] == [many.committable(tp) for tp in tps]


def test_done_all_refuses_an_offset_never_consumed() -> None:
    t = OffsetTracker()
    t.consumed(TP, 4)
    with pytest.raises(ValueError, match="never consumed"):
        t.done_all([Source(*TP, 4), Source(*TP, 9)])
