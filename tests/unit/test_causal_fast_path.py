"""The gate's batch offer (``CausalGate.offer_all``): a fast path for events with no cause and
nothing parked on their key, with the same results as offering the events one by one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.causal import CausalGate
from agents.offset_tracker import Arrival
from tests.unit.test_causal import Feed, ids


def test_events_without_a_cause_on_free_keys_are_released_at_once_without_a_deadline() -> None:
    gate, feed = CausalGate(timeout_s=10.0, max_parked=100), Feed()
    parked = gate.offer_all([feed("a", "p1"), feed("b", "p2"), feed("c", "p1")], now=0)
    assert parked == []
    assert ids(gate.drain().ready) == ["a", "b", "c"]
    assert gate.pending_count == 3 and gate.next_deadline() is None


def test_an_event_without_a_cause_behind_a_parked_one_on_its_key_waits_and_is_reported_parked() -> None:
    gate, feed = CausalGate(timeout_s=10.0, max_parked=100), Feed()
    parked = gate.offer_all([feed("e", "p1", caused_by="c"), feed("f", "p1"), feed("g", "p2")], now=0)
    assert ids(parked) == ["e", "f"]
    assert ids(gate.drain().ready) == ["g"]
    # The cause arrives without a cause of its own: fast path, and it wakes what waits on it.
    assert gate.offer_all([feed("c", "p3")], now=1) == []
    assert ids(gate.drain().ready) == ["c", "e", "f"]


def test_copies_of_held_or_applied_events_are_duplicates_on_the_fast_path_too() -> None:
    gate, feed = CausalGate(timeout_s=10.0, max_parked=100), Feed()
    gate.learn_applied([("w1", "old")])
    gate.offer_all([feed("a", "p1"), feed("a", "p2"), feed("old", "p3")], now=0)
    out = gate.drain()
    assert ids(out.ready) == ["a"] and ids(out.duplicates) == ["a", "old"]


_steps = st.lists(
    st.tuples(
        st.sampled_from(["e0", "e1", "e2", "e3", "e4", "e5"]),  # event ids (repeats are copies)
        st.sampled_from(["p0", "p1", "p2"]),  # keys
        st.one_of(st.none(), st.sampled_from(["e0", "e1", "e2", "e3", "e4", "e5", "gone"])),  # causes
        st.integers(0, 1),  # partition
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(batches=st.lists(_steps, min_size=1, max_size=4), applied=st.sets(st.sampled_from(["e0", "e3", "gone"])))
def test_offer_all_equals_offering_one_by_one(batches: list[list[tuple]], applied: set[str]) -> None:
    one, many = CausalGate(timeout_s=5.0, max_parked=1_000), CausalGate(timeout_s=5.0, max_parked=1_000)
    for gate in (one, many):
        gate.learn_applied([("w1", i) for i in sorted(applied)])
    feed_one, feed_many = Feed(), Feed()
    for t, steps in enumerate(batches):
        arrivals_one = [feed_one(i, pk, cause, partition=p) for i, pk, cause, p in steps]
        arrivals_many = [feed_many(i, pk, cause, partition=p) for i, pk, cause, p in steps]
        parked_one: list[Arrival] = []
        for a in arrivals_one:
            held_before = one.is_parked(a.ref)  # then this one is a copy: a duplicate, not parked
            one.offer(a, now=t)
            if one.is_parked(a.ref) and not held_before:
                parked_one.append(a)
        parked_many = many.offer_all(arrivals_many, now=t)
        assert [(a.ref, a.offset) for a in parked_many] == [(a.ref, a.offset) for a in parked_one]
        for gate in (one, many):
            gate.expire(now=t + 3)
        a_out, b_out = one.drain(), many.drain()
        for field in ("ready", "duplicates"):
            got = [(x.ref, x.offset) for x in getattr(b_out, field)]
            assert got == [(x.ref, x.offset) for x in getattr(a_out, field)]
        assert [(r.arrival.offset, r.reason) for r in a_out.dead] == [(r.arrival.offset, r.reason) for r in b_out.dead]
        assert (one.parked_count, one.pending_count) == (many.parked_count, many.pending_count)
        assert one.unknown_causes() == many.unknown_causes()
