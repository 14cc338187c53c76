"""The change-event contract: good events decode; each kind of bad input gets its own reason."""

from __future__ import annotations

import orjson
import pytest

from models.events import ChangeEvent, ChangeType, EntityKind, Invalid, decode


def good(**over: object) -> dict:
    doc = {
        "event_id": "e-1",
        "world_id": "prod",
        "object_type": "Equipment",
        "object_pk": "eq-1",
        "change_type": "UPDATE",
        "before_properties": {"status": "broken"},
        "after_properties": {"status": "repaired"},
        "version": 3,
        "caused_by": None,
        "occurred_at": "2026-01-15T10:00:00Z",
        "schema_version": 2,
        "source": "ontology-svc",
    }
    doc.update(over)
    return doc


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


BAD: list[tuple[str, bytes | None, str]] = [
    ("tombstone", None, "tombstone"),
    ("not json", b"{not json", "malformed-json"),
    ("binary garbage", b"\xff\xfe\x00", "malformed-json"),
    ("json array", b"[1,2]", "not-an-object"),
    ("json string", b'"hello"', "not-an-object"),
    ("json null", b"null", "not-an-object"),
    ("missing event_id", orjson.dumps({k: v for k, v in good().items() if k != "event_id"}), "missing-field"),
    ("empty event_id", orjson.dumps(good(event_id="  ")), "empty-field"),
    ("numeric event_id", orjson.dumps(good(event_id=12)), "wrong-type"),
    ("huge event_id", orjson.dumps(good(event_id="x" * 500)), "field-too-long"),
    ("NUL in id", orjson.dumps(good(event_id="a\x00b")), "bad-characters"),
    ("missing world", orjson.dumps({k: v for k, v in good().items() if k != "world_id"}), "missing-field"),
    ("ref injection", orjson.dumps(good(world_id="main@abc")), "bad-world-id"),
    ("path world", orjson.dumps(good(world_id="../x")), "bad-world-id"),
    ("empty world", orjson.dumps(good(world_id="")), "bad-world-id"),
    ("long world", orjson.dumps(good(world_id="w" * 300)), "bad-world-id"),
    ("unicode world", orjson.dumps(good(world_id="wörld")), "bad-world-id"),
    ("unknown change", orjson.dumps(good(change_type="MERGE")), "unknown-change-type"),
    ("lowercase change", orjson.dumps(good(change_type="update")), "unknown-change-type"),
    ("missing pk", orjson.dumps({k: v for k, v in good().items() if k != "object_pk"}), "missing-field"),
    ("missing type", orjson.dumps({k: v for k, v in good().items() if k != "object_type"}), "missing-field"),
    ("create w/o after", orjson.dumps(good(change_type="CREATE", after_properties=None)), "missing-after"),
    ("props not object", orjson.dumps(good(after_properties=[1, 2])), "wrong-type"),
    ("version string", orjson.dumps(good(version="3")), "wrong-type"),
    ("version bool", orjson.dumps(good(version=True)), "wrong-type"),
    ("negative version", orjson.dumps(good(version=-1)), "negative-number"),
    ("missing version", orjson.dumps({k: v for k, v in good().items() if k != "version"}), "missing-field"),
    ("self caused", orjson.dumps(good(caused_by="e-1")), "self-caused"),
    ("bad timestamp", orjson.dumps(good(occurred_at="yesterday")), "bad-timestamp"),
    ("missing timestamp", orjson.dumps(good(occurred_at=None)), "missing-field"),
    ("source not string", orjson.dumps(good(source={"a": 1})), "wrong-type"),
    ("oversized", orjson.dumps(good(after_properties={"blob": "x" * 2_000_000})), "oversized"),
]


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
