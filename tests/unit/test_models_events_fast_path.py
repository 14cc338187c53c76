"""The decoder's one-pass path for well-formed events builds exactly what field-by-field validation
builds, and leaves every unusual document to it (so rejections keep their reasons)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from models.events import ChangeEvent, EntityKind, _fast_event, _Reject, validate, validate_fields

OBJECT = {
    "event_id": "ev-1",
    "world_id": "prod",
    "object_type": "Equipment",
    "object_pk": "eq-1",
    "change_type": "UPDATE",
    "before_properties": {"a": 1},
    "after_properties": {"a": 2},
    "version": 3,
    "caused_by": "ev-0",
    "causal_order": 2,
    "occurred_at": 1_768_471_200_000,
    "schema_version": 1,
    "source": "svc",
}
LINK = {
    **{k: v for k, v in OBJECT.items() if k not in ("object_type", "object_pk")},
    "link_type": "located_in",
    "link_pk": "l-1",
    "from_pk": "eq-1",
    "to_pk": "site-9",
}
FIELDS = sorted(set(OBJECT) | set(LINK) | {"unchanged_properties"})
ODD: list[Any] = [
    None,
    "",
    " ",
    "\t\n",
    "\u2003",
    "a\x00b",
    "x" * 200,
    "x" * 201,
    "y" * 512,
    "y" * 513,
    0,
    -1,
    1,
    2**63 - 1,
    2**63,
    True,
    False,
    1.5,
    [],
    ["p"],
    [1],
    {},
    {"k": "v"},
    "CREATE",
    "UPDATE",
    "DELETE",
    "SNAPSHOT",
    "TRUNCATE",
    "create",
    "prod",
    "Prod",
    "w-1",
    "p@x",
    "z" * 64,
    "ev-1",
    "2026-01-15T10:00:00Z",
    "not a time",
]


def _outcome(check: Any, doc: Any, kind: EntityKind | None) -> ChangeEvent | tuple[str, str]:
    try:
        return check(doc, kind)
    except _Reject as rej:
        return (rej.reason, rej.detail)


@given(
    base=st.sampled_from([OBJECT, LINK]),
    changes=st.dictionaries(st.sampled_from(FIELDS), st.sampled_from(ODD), max_size=4),
    dropped=st.sets(st.sampled_from(FIELDS), max_size=2),
    kind=st.sampled_from([None, EntityKind.OBJECT, EntityKind.LINK]),
)
def test_the_fast_path_agrees_with_field_by_field_validation(
    base: dict[str, Any], changes: dict[str, Any], dropped: set[str], kind: EntityKind | None
) -> None:
    doc = {k: v for k, v in {**base, **changes}.items() if k not in dropped}
    assert _outcome(validate, doc, kind) == _outcome(validate_fields, doc, kind)


def test_well_formed_objects_and_links_take_the_fast_path() -> None:
    for doc, kind in ((OBJECT, EntityKind.OBJECT), (LINK, EntityKind.LINK), ({**LINK, "change_type": "DELETE"}, None)):
        event = _fast_event(doc, kind)
        assert event is not None and event == validate_fields(doc, kind)
    deleted_link = {k: v for k, v in LINK.items() if k not in ("from_pk", "to_pk")} | {"change_type": "DELETE"}
    assert _fast_event(deleted_link, EntityKind.LINK) == validate_fields(deleted_link, EntityKind.LINK)
    assert _fast_event({**OBJECT, "occurred_at": "2026-01-15T10:00:00Z"}, None) is None  # parsed by the slow path


def test_every_single_odd_field_gets_the_same_outcome_on_both_paths() -> None:
    """Each field of an object and of a link set to each odd value, or left out: same event, or
    same reason and detail."""
    for base in (OBJECT, LINK, {**LINK, "change_type": "DELETE"}):
        for kind in (None, EntityKind.OBJECT, EntityKind.LINK):
            for field in FIELDS:
                for doc in [{**base, field: v} for v in ODD] + [{k: v for k, v in base.items() if k != field}]:
                    assert _outcome(validate, doc, kind) == _outcome(validate_fields, doc, kind), (field, doc)


def test_the_draft_has_the_events_fields_and_becomes_a_frozen_change_event() -> None:
    import dataclasses
    import inspect

    from models.events import _EventDraft, new_event

    names = [f.name for f in dataclasses.fields(ChangeEvent)]
    assert list(inspect.signature(_EventDraft.__init__).parameters)[1:] == names
    assert _EventDraft.__slots__ == ChangeEvent.__slots__
    event = validate_fields(OBJECT, EntityKind.OBJECT)
    values = [getattr(event, n) for n in names]
    built = new_event(*values)
    assert type(built) is ChangeEvent and built == ChangeEvent(*values) and built == event
    assert built.key == event.key and built.to_wire() == event.to_wire()
    try:
        built.version = 99  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a built event must stay frozen")
    assert dataclasses.replace(built, version=4).version == 4 and built.version == event.version
