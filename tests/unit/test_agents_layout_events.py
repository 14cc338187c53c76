"""Layout control events (pure): decoding, refusals with a reason, the answer of one table."""

from __future__ import annotations

import orjson
import pytest

from agents.layout_events import LayoutChange, answer, decode_layout_change, is_layout_event
from models.events import Invalid
from sinks.layout import Layout, PartField, plan_evolution
from sinks.layout_run import EvolveResult


def doc(**fields: object) -> bytes:
    base: dict[str, object] = {"event": "table.layout.evolve", "change_id": "c1", "world_id": "w1", "table": "all"}
    return orjson.dumps({**base, **fields})


def test_a_layout_event_decodes_and_names_its_tables() -> None:
    change = decode_layout_change(doc(spec="default", dry_run=True))
    assert change == LayoutChange("c1", "w1", "all", "default", None, True)
    assert isinstance(change, LayoutChange)
    assert change.tables() == ["entity_events", "entity_common", "entity_edge"]
    one = decode_layout_change(doc(table="entity_edge", sort="none", world_id="*"))
    assert isinstance(one, LayoutChange) and one.tables() == ["entity_edge"] and one.world_id == "*"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"change_id": ""}, "missing-change-id"),
        ({"world_id": "../etc", "spec": "default"}, "bad-world-id"),
        ({"table": "users", "spec": "default"}, "unknown-table"),
        ({}, "no-layout"),
        ({"spec": 16}, "bad-layout"),
        ({"spec": "default", "dry_run": "yes"}, "bad-dry-run"),
    ],
)
def test_a_bad_layout_event_is_refused_with_a_reason(fields: dict[str, object], reason: str) -> None:
    got = decode_layout_change(doc(**fields))
    assert isinstance(got, Invalid) and got.reason == reason and got.detail


def test_only_layout_events_are_taken_from_the_schema_topic() -> None:
    assert is_layout_event(doc(spec="default"))
    schema_change = orjson.dumps({"change_id": "table.layout.evolve", "world_id": "w1", "kind": "object"})
    assert not is_layout_event(schema_change)
    assert not is_layout_event(b"not json table.layout.evolve")
    assert not is_layout_event(None)


def test_the_answer_shows_old_and_new_spec_and_the_status() -> None:
    old = Layout((), ())
    new = Layout((PartField("identity", "object_type_id"),), ("object_pk",))
    evo = plan_evolution(old, new)
    change = LayoutChange("c1", "w1", "entity_common", "object_type_id", None, True)
    dry = EvolveResult("w1", "world-w1", "entity_common", evo, True, None, "h0", 1)
    got = answer(change, "w1", "entity_common", dry, None)
    assert got["status"] == "dry-run" and got["commit"] is None
    assert got["old"] == {"spec": "none", "sort": "none"}
    assert got["new"] == {"spec": "identity(object_type_id)", "sort": "object_pk"}
    done = EvolveResult("w1", "world-w1", "entity_common", evo, False, "h1", "h0", 1)
    assert answer(change, "w1", "entity_common", done, None)["status"] == "applied"
    same = EvolveResult("w1", "world-w1", "entity_common", plan_evolution(new, new), False, None, "h0", 1)
    assert answer(change, "w1", "entity_common", same, None)["status"] == "unchanged"
    assert answer(change, "w1", "entity_common", None, "bad-layout: x") == {
        "event": "table.layout.evolved", "change_id": "c1", "world_id": "w1", "table": "entity_common",
        "status": "refused", "reason": "bad-layout: x",
    }  # fmt: skip
