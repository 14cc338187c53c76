"""The change-event contract: good events decode; each kind of bad input gets its own reason."""

from __future__ import annotations

import orjson
import pytest

from models.events import ChangeEvent, ChangeType, EntityKind, Invalid, decode
from tests.wire_events import BAD, good


def test_good_object_event_decodes() -> None:
    ev = decode(orjson.dumps(good()), key=b"prod::eq-1", topic_kind=EntityKind.OBJECT)
    assert isinstance(ev, ChangeEvent)
    assert ev.kind is EntityKind.OBJECT and ev.change_type is ChangeType.UPDATE
    assert ev.occurred_at_ms == 1768471200000
    assert ev.key == "prod::eq-1"
    # encode → decode is the identity
    assert decode(ev.encode()) == ev


def test_good_link_event_decodes() -> None:
    doc = good(link_type="located_in", link_pk="l-1", from_pk="eq-1", to_pk="site-9", change_type="CREATE")
    del doc["object_type"], doc["object_pk"]
    ev = decode(orjson.dumps(doc), key=b"prod::l-1", topic_kind=EntityKind.LINK)
    assert isinstance(ev, ChangeEvent)
    assert (ev.kind, ev.entity_pk, ev.from_pk, ev.to_pk) == (EntityKind.LINK, "l-1", "eq-1", "site-9")


def test_epoch_millis_and_truncate() -> None:
    ev = decode(orjson.dumps(good(occurred_at=1700000000123, change_type="TRUNCATE", object_pk=None)))
    assert isinstance(ev, ChangeEvent)
    assert ev.occurred_at_ms == 1700000000123 and ev.entity_pk == "*"


@pytest.mark.parametrize(("name", "value", "reason"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_a_reason(name: str, value: bytes | None, reason: str) -> None:
    result = decode(value)
    assert isinstance(result, Invalid), name
    assert result.reason == reason
    assert result.detail


def test_link_on_objects_topic_is_rejected() -> None:
    doc = good(link_type="x", link_pk="l", from_pk="a", to_pk="b")
    result = decode(orjson.dumps(doc), topic_kind=EntityKind.OBJECT)
    assert isinstance(result, Invalid) and result.reason == "wrong-topic"


def test_key_must_match_world_and_pk() -> None:
    result = decode(orjson.dumps(good()), key=b"other::eq-1")
    assert isinstance(result, Invalid) and result.reason == "key-mismatch"
    assert result.event_id == "e-1"
