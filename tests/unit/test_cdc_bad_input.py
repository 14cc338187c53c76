"""A corpus of bad CDC records: each gets its own stable reason, and the batch goes on around it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.cdc import plan_batch
from cdc.convert import Converted, Ignored, Position, Rejected, convert
from cdc.mapping_loader import load_mapping
from models.deadletter import H_DETAIL, H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, DeadLetter
from streams.settings import Settings
from tests.unit.test_debezium import dec_b64, field, payload, pg_source, wrap

TOPIC = "cdc.raw.erp.orders"
MAPPING = load_mapping(
    {
        "tables": [
            {"topic": TOPIC, "world": "prod", "object_type": "Order", "pk": ["id"]},
            {"topic": "cdc.raw.erp.tenanted", "world": {"column": "tenant"}, "object_type": "T", "pk": "id"},
        ]
    }
)
SETTINGS = Settings(objects_topic="objs", links_topic="links", dlq_topic="dlq", max_event_bytes=4096)


def j(doc: Any) -> bytes:
    return orjson.dumps(doc)


def good(id_: Any = 1, **more: Any) -> bytes:
    return j(payload("c", after={"id": id_, "customer": "acme", **more}))


TYPED = [field("id", "int32", optional=False), field("customer", "string")]
DECIMAL_ROW = [
    field("id", "int32"),
    field("total", "bytes", logical="org.apache.kafka.connect.data.Decimal", scale="2"),
]
NOT_ENVELOPE = {"type": "struct", "fields": []}
NO_TIME = pg_source(ts_ms=None, lsn=None)


def typed(after: dict[str, Any], row_fields: list[dict[str, Any]] = TYPED) -> bytes:
    return j(wrap(payload("c", after=after), row_fields))


CORPUS: list[tuple[str, bytes, str]] = [
    ("malformed json", b'{"op": "c", "after": {', "malformed-json"),
    ("not utf-8", b'{"op": "\xff"}', "malformed-json"),
    ("json array", b"[1, 2, 3]", "not-an-envelope"),
    ("json number", b"42", "not-an-envelope"),
    ("flattened row (no op)", j({"id": 1, "customer": "acme"}), "not-an-envelope"),
    ("unknown op", j(payload("z", after={"id": 1})), "unknown-op"),
    ("op of the wrong type", j(payload(7, after={"id": 1})), "unknown-op"),  # type: ignore[arg-type]
    ("create without after", j(payload("c")), "missing-after"),
    ("delete without before", j(payload("d")), "missing-before"),
    ("no source block", j({**payload("c", after={"id": 1}), "source": None}), "missing-source"),
    ("source without table", j({**payload("c", after={"id": 1}), "source": {"db": "erp"}}), "missing-source"),
    ("lsn not a number", j(payload("c", after={"id": 1}, source=pg_source(lsn="x"))), "bad-source"),
    ("after is a list", j({**payload("c"), "after": [1]}), "bad-envelope"),
    ("missing pk column", j(payload("c", after={"customer": "acme"})), "missing-pk-column"),
    ("null pk", good(id_=None), "null-pk"),
    ("empty pk", good(id_=""), "empty-field"),
    ("pk too long", good(id_="k" * 600), "field-too-long"),
    ("NUL in pk", good(id_="a\x00b"), "bad-characters"),
    ("schema says int, payload string", typed({"id": "1", "customer": "a"}), "schema-mismatch"),
    ("column not in schema", typed({"id": 1, "customer": "a", "x": 1}), "schema-mismatch"),
    ("null in required column", typed({"id": None, "customer": "a"}), "schema-mismatch"),
    ("schema is not an envelope", j({"schema": NOT_ENVELOPE, "payload": payload("c", after={"id": 1})}),
     "schema-mismatch"),
    ("bad base64 decimal", typed({"id": 1, "total": "%%%"}, DECIMAL_ROW), "schema-mismatch"),
    ("oversized input", good(customer="x" * 5000), "oversized"),
    ("no timestamp at all", j({**payload("c", after={"id": 1}, source=NO_TIME), "ts_ms": None}),
     "missing-timestamp"),
]  # fmt: skip

TENANTED: list[tuple[str, bytes, str]] = [
    ("world column missing", j(payload("c", after={"id": 1})), "missing-world-column"),
    ("world column null", j(payload("c", after={"id": 1, "tenant": None})), "null-world"),
    ("world not a valid id", j(payload("c", after={"id": 1, "tenant": "../main"})), "bad-world-id"),
    ("truncate with column world", j(payload("t")), "truncate-world-unknown"),
]


@pytest.mark.parametrize(("name", "value", "reason"), CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus_reasons(name: str, value: bytes, reason: str) -> None:
    result = convert(value, MAPPING, Position(TOPIC, 0, 0), max_bytes=4096)
    assert isinstance(result, Rejected), result
    assert result.reason == reason, result.detail
    assert result.detail


@pytest.mark.parametrize(("name", "value", "reason"), TENANTED, ids=[c[0] for c in TENANTED])
def test_world_column_reasons(name: str, value: bytes, reason: str) -> None:
    result = convert(value, MAPPING, Position("cdc.raw.erp.tenanted", 0, 0))
    assert isinstance(result, Rejected) and result.reason == reason, result


def test_unmapped_table_is_a_reason() -> None:
    result = convert(good(), MAPPING, Position("cdc.raw.erp.nothing", 0, 0))
    assert isinstance(result, Rejected) and result.reason == "unmapped-table"


def test_change_event_over_the_limit_is_oversized() -> None:
    # the input fits, but the mapped event (with its event fields) does not
    small_source = {"connector": "p", "db": "d", "table": "t", "ts_ms": 1, "lsn": 1}
    value = j(payload("u", after={"id": 1, "a": "y" * 3000}, source=small_source))
    m = load_mapping({"tables": [{"source": {"table": "t"}, "world": "prod", "object_type": "O", "pk": "id"}]})
    result = convert(value, m, Position("cdc.raw.x.t", 0, 0), max_bytes=len(value) + 1)
    assert isinstance(result, Rejected) and result.reason == "oversized"


def test_nesting_too_deep_to_write_is_rejected() -> None:
    deep = b"[" * 300 + b"1" + b"]" * 300  # orjson reads this deep, but writes at most 255 levels
    value = good(doc="DEEP").replace(b'"DEEP"', deep)
    result = convert(value, MAPPING, Position(TOPIC, 0, 0), max_bytes=1_000_000)
    assert isinstance(result, Rejected) and result.reason == "unencodable"


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = b'{"id":1}'
    headers: list[tuple[str, bytes]] = dataclasses.field(default_factory=list)


def test_batch_goes_on_around_bad_records_and_dead_letters_them_with_headers() -> None:
    recs = [
        Rec(TOPIC, 0, 10, good(1)),
        Rec(TOPIC, 0, 11, b"{broken", headers=[("trace", b"t-1")]),
        Rec(TOPIC, 0, 12, None),  # tombstone
        Rec(TOPIC, 0, 13, j({"ts_ms": 1})),  # heartbeat
        Rec(TOPIC, 1, 5, good(2)),
        Rec(TOPIC, 1, 6, good(None)),
        Rec("cdc.raw.erp.nothing", 0, 0, good(3)),
    ]
    plan = plan_batch(recs, MAPPING, SETTINGS, now_ms=1_000)
    assert plan.events == 2
    assert plan.ignored == {"tombstone": 1, "heartbeat": 1}
    assert plan.rejected == {"malformed-json": 1, "null-pk": 1, "unmapped-table": 1}
    assert plan.commit == {(TOPIC, 0): 14, (TOPIC, 1): 7, ("cdc.raw.erp.nothing", 0): 1}
    by_topic: dict[str, list[Any]] = {}
    for o in plan.outgoing:
        by_topic.setdefault(o.topic, []).append(o)
    assert [o.key for o in by_topic["objs"]] == [b"prod::1", b"prod::2"]
    dlq = by_topic["dlq"]
    assert len(dlq) == 3
    first = dict(dlq[0].headers)
    assert first[H_REASON] == b"malformed-json" and first[H_TOPIC] == TOPIC.encode()
    assert (first[H_PARTITION], first[H_OFFSET]) == (b"0", b"11")
    assert first["trace"] == b"t-1"  # the producer's own headers are kept
    assert dlq[0].value == b"{broken" and dlq[0].key == b'{"id":1}'  # the original bytes, unchanged
    back = DeadLetter.from_record(dlq[1].key, dlq[1].value, dlq[1].headers)
    assert (back.reason, back.offset, back.first_seen_ms) == ("null-pk", 6, 1_000)


def test_huge_rejected_value_goes_to_the_dlq_without_its_bytes() -> None:
    rec = Rec(TOPIC, 3, 99, b"x" * 10_000)
    plan = plan_batch([rec], MAPPING, SETTINGS, now_ms=0, dlq_max_value_bytes=1_000)
    (out,) = plan.outgoing
    assert out.value is None
    headers = dict(out.headers or [])
    assert headers[H_REASON] == b"oversized"
    assert b"re-read it from cdc.raw.erp.orders/3@99" in headers[H_DETAIL]


def test_event_batch_plan_is_deterministic() -> None:
    recs = [Rec(TOPIC, 0, i, good(i, total=dec_b64("1.5", 1))) for i in range(5)]
    a = plan_batch(recs, MAPPING, SETTINGS, now_ms=1)
    b = plan_batch(recs, MAPPING, SETTINGS, now_ms=2)
    assert a.outgoing == b.outgoing


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise(value: bytes) -> None:
    assert isinstance(convert(value, MAPPING, Position(TOPIC, 0, 0)), Converted | Ignored | Rejected)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["c", "u", "d", "r", "t", "m", "x", None]),
    json_values,
    json_values,
    st.one_of(json_values, st.just(pg_source())),
    st.booleans(),
)
def test_random_envelopes_never_raise(op: Any, before: Any, after: Any, source: Any, wrapped: bool) -> None:
    doc: dict[str, Any] = {"op": op, "before": before, "after": after, "source": source, "ts_ms": 5}
    if wrapped:
        after_schema = {"field": "after", "type": "struct", "fields": [{"field": "id", "type": "int32"}]}
        schema = {"type": "struct", "fields": [{"field": "op", "type": "string"}, after_schema]}
        doc = {"schema": schema, "payload": doc}
    result = convert(j(doc), MAPPING, Position(TOPIC, 0, 0))
    assert isinstance(result, Converted | Ignored | Rejected)
