"""The TRUNCATE duplicate guard's pure part: which events may be copies of events a truncate hid."""

from __future__ import annotations

from models.events import ChangeType, EntityKind
from sinks.truncates import raise_ceilings, truncate_suspects, truncated_before
from tests.factories import change_event, link_event


def test_only_events_of_a_truncated_type_at_or_below_its_ceiling_are_suspects() -> None:
    """Updates to live keys above the ceiling (the common case after a reload) read no log."""
    events = [
        change_event("up", version=11),  # above every version T had when truncated
        change_event("at", pk="p2", version=10),  # at the ceiling: may be a copy
        change_event("low", pk="p3", version=3),  # a re-created key at a restarted version: may be a copy
        change_event("other", entity_type="U", version=1),  # a type never truncated
        link_event("link", frm="a", to="b", link_type="T", version=1),  # link/T is another scope
    ]
    assert truncate_suspects(events, {"object/T": 10}) == {"at", "low"}


def test_a_ceiling_not_known_makes_every_event_of_the_type_a_suspect_and_a_truncate_none() -> None:
    events = [change_event("a", version=99), change_event("t", change=ChangeType.TRUNCATE, version=1)]
    assert truncate_suspects(events, {"object/T": None}) == {"a"}


def test_a_batch_truncate_hides_the_versions_before_it_not_after_it() -> None:
    events = [
        change_event("a", version=7),
        change_event("b", pk="p2", version=4),
        change_event("t", change=ChangeType.TRUNCATE, version=2),
        change_event("c", version=50),  # after the last truncate: the version rule guards it
        change_event("o", entity_type="U", version=80),  # U is not truncated here
    ]
    assert truncated_before(events) == {"object/T": 7}


def test_a_second_truncate_in_the_batch_hides_what_came_between() -> None:
    events = [
        change_event("t1", change=ChangeType.TRUNCATE, version=1),
        change_event("a", version=30),
        change_event("t2", change=ChangeType.TRUNCATE, version=2),
        link_event("l", frm="a", to="b", link_type="T", version=90),
    ]
    assert truncated_before(events) == {"object/T": 30}
    assert truncated_before([events[-1]]) == {}
    assert events[-1].kind is EntityKind.LINK


def test_ceilings_only_rise_and_an_unknown_one_takes_the_top() -> None:
    ceilings: dict[str, int | None] = {"object/T": 10, "object/U": None, "link/K": 5}
    assert raise_ceilings(ceilings, {"object/T": 4, "object/U": 3, "object/V": 1}) == {
        "object/T": 10,
        "object/U": 3,
        "link/K": 5,
        "object/V": 1,
    }
