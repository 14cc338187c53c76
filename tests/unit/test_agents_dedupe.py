"""Dedupe decisions and the version rule, given the answers of Redis and the branch head."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.dedupe import (
    STALE_VERSION,
    applied_key,
    decide_versions,
    drop_duplicates,
    entities_of,
    entity_ref,
    is_stale,
    legacy_applied_key,
    marks_after_commit,
    parse_applied_key,
    refs_to_check,
)
from agents.offset_tracker import Arrival
from models.events import ChangeType
from sinks.committed_offsets import Source
from tests.factories import change_event

TOPIC = "onto.changes.objects"


def arrival(
    event_id: str,
    pk: str = "p1",
    version: int = 1,
    world: str = "w1",
    caused_by: str | None = None,
    change: ChangeType = ChangeType.UPDATE,
    offset: int = 0,
    entity_type: str = "Person",
) -> Arrival:
    event = change_event(
        event_id,
        world=world,
        entity_type=entity_type,
        pk=pk,
        change=change,
        version=version,
        after={"v": version},
        caused_by=caused_by,
    )
    return Arrival(event, Source(TOPIC, 0, offset))


def test_key_format_and_parse() -> None:
    # The world is the hash tag (Redis Cluster: one world's marks in one slot).
    assert applied_key("w1", "e-1") == "causeway:applied:{w1}:e-1"
    assert parse_applied_key("causeway:applied:{w1}:a:b:c") == ("w1", "a:b:c")
    # The format before the hash tag is still understood (read until those marks expire).
    assert legacy_applied_key("w1", "e-1") == "causeway:applied:w1:e-1"
    assert parse_applied_key("causeway:applied:w1:a:b:c") == ("w1", "a:b:c")
    for bad in (
        "causeway:applied:w1",
        "other:w1:e",
        "causeway:applied::e",
        "causeway:applied:{w1}",
        "causeway:applied:{}:e",
    ):
        with pytest.raises(ValueError):
            parse_applied_key(bad)


def test_refs_to_check_covers_events_causes_and_extra_once() -> None:
    batch = [arrival("a"), arrival("b", caused_by="a"), arrival("c", caused_by="z", world="w2")]
    refs = refs_to_check(batch, extra=[("w1", "q"), ("w1", "a")])
    assert refs == [("w1", "a"), ("w1", "b"), ("w2", "c"), ("w2", "z"), ("w1", "q")]


def test_drop_duplicates_against_redis_and_within_the_batch() -> None:
    batch = [arrival("a", offset=0), arrival("b", offset=1), arrival("a", offset=2), arrival("c", offset=3)]
    batch.append(arrival("c", world="w2", offset=4))  # same id, other world: a different event
    out = drop_duplicates(batch, marked={("w1", "b")})
    assert [a.offset for a in out.fresh] == [0, 3, 4]
    assert [a.offset for a in out.duplicates] == [1, 2]


def test_marks_after_commit_are_unique_keys() -> None:
    assert marks_after_commit([("w1", "a"), ("w2", "a"), ("w1", "a")]) == [
        "causeway:applied:{w1}:a",
        "causeway:applied:{w2}:a",
    ]


def test_version_rule_stale_is_older_or_equal() -> None:
    assert not is_stale(3, None)
    assert not is_stale(3, 2)
    assert is_stale(3, 3)
    assert is_stale(2, 3)


def test_decide_versions_against_stored_and_earlier_in_batch() -> None:
    a1 = arrival("a1", pk="p1", version=5)  # stored 4 → applies
    a2 = arrival("a2", pk="p1", version=5)  # equal to a1 just applied → stale
    a3 = arrival("a3", pk="p1", version=7)
    b1 = arrival("b1", pk="p2", version=1)  # stored 3 → older → stale
    c1 = arrival("c1", pk="p3", version=0)  # never seen → applies
    stored = {entity_ref(a1.event): 4, entity_ref(b1.event): 3}
    assert entities_of([a1, a2, a3, b1, c1]) == [
        entity_ref(a1.event),
        entity_ref(b1.event),
        entity_ref(c1.event),
    ]
    d = decide_versions([a1, a2, a3, b1, c1], stored)
    assert [a.event.event_id for a in d.apply] == ["a1", "a3", "c1"]
    assert [(s.arrival.event.event_id, s.stored_version) for s in d.stale] == [("a2", 5), ("b1", 3)]
    assert all(s.reason == STALE_VERSION for s in d.stale)
    assert "equals the stored version 5" in d.stale[0].detail
    assert "is older than the stored version 3" in d.stale[1].detail


def test_entities_are_per_world_kind_and_type() -> None:
    a = arrival("a", pk="p1", version=1, world="w2")
    b = arrival("b", pk="p1", version=1, entity_type="Place")
    stored = {entity_ref(arrival("x", pk="p1").event): 9}  # w1 / object / Person / p1
    d = decide_versions([a, b], stored)
    assert len(d.apply) == 2 and not d.stale


def test_truncate_always_applies_and_clears_versions_of_its_type() -> None:
    before = arrival("u1", pk="p1", version=9)
    trunc = arrival("t", version=0, change=ChangeType.TRUNCATE)
    after = arrival("u2", pk="p1", version=1)  # rows are gone: an old stored version no longer counts
    other_type = arrival("o", pk="p1", version=1, entity_type="Place")
    stored = {entity_ref(other_type.event): 4}
    d = decide_versions([before, trunc, after, other_type], stored)
    assert [a.event.event_id for a in d.apply] == ["u1", "t", "u2"]
    assert [s.arrival.event.event_id for s in d.stale] == ["o"]
    assert entities_of([trunc]) == []


@given(
    versions=st.lists(st.tuples(st.sampled_from(["p1", "p2", "p3"]), st.integers(0, 6)), max_size=30),
    stored=st.dictionaries(st.sampled_from(["p1", "p2", "p3"]), st.integers(0, 6)),
)
@settings(max_examples=150, deadline=None)
def test_applied_versions_strictly_increase_per_entity(versions: list[tuple[str, int]], stored: dict[str, int]) -> None:
    batch = [arrival(f"e{i}", pk=pk, version=v, offset=i) for i, (pk, v) in enumerate(versions)]
    stored_refs = {entity_ref(arrival("x", pk=pk).event): v for pk, v in stored.items()}
    d = decide_versions(batch, stored_refs)
    assert len(d.apply) + len(d.stale) == len(batch)
    last = dict(stored)
    for a in d.apply:
        pk = a.event.entity_pk
        assert pk not in last or a.event.version > last[pk]
        last[pk] = a.event.version
    # every stale event was not newer than what was in force when its turn came
    assert all(s.arrival.event.version <= s.stored_version for s in d.stale)
    # order of the applied events is the input order
    assert [a.offset for a in d.apply] == sorted(a.offset for a in d.apply)
