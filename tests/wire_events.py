"""Change-topic record values as producers send them: one good event document and a corpus of bad
ones, each with the dead-letter reason it must get. Shared by the decoder's unit tests and the
applier's integration test."""

from __future__ import annotations

import orjson


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
