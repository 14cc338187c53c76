"""CDC mapping: config validation, lookup, composite keys, renames, worlds, versions and event ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.convert import CdcEvent, Converted, Ignored, Position, Rejected, convert, join_pk, source_version
from cdc.debezium import UNAVAILABLE_PLACEHOLDER, SourceInfo
from cdc.mapping import CdcMapping, MappingError, parse_mapping
from cdc.mapping_loader import load_cdc_mapping, load_mapping
from models.events import ChangeEvent, ChangeType, EntityKind, decode
from streams.settings import Settings
from tests.unit.test_debezium import TS, dec_b64, field, mysql_source, payload, pg_source, wrap

TOPIC = "cdc.raw.erp.orders"
POS = Position(TOPIC, 2, 41)


def mapping(**table: Any) -> CdcMapping:
    base: dict[str, Any] = {"topic": TOPIC, "world": "prod", "object_type": "Order", "pk": ["id"]}
    base.update(table)
    return load_mapping({"tables": [base]})


def events(value: dict[str, Any], m: CdcMapping, pos: Position = POS) -> list[CdcEvent]:
    result = convert(orjson.dumps(value), m, pos)
    assert isinstance(result, Converted), result
    return list(result.events)


def single(value: dict[str, Any], m: CdcMapping, pos: Position = POS) -> ChangeEvent:
    (ev,) = events(value, m, pos)
    return ev.event


def order(id_: int = 7, customer: str = "acme", total: str = "12.30") -> dict[str, Any]:
    return {"id": id_, "customer": customer, "total": dec_b64(total, 2)}


# --- config validation ---------------------------------------------------------------------------


def t(**kw: Any) -> dict[str, Any]:
    """A table mapping with good defaults; a keyword set to None removes that key."""
    base: dict[str, Any] = {"topic": TOPIC, "world": "prod", "object_type": "A", "pk": "id"}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


LINK = {"type": "L", "from": "a"}


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ([], "top level must be a mapping"),
        ({}, "tables: must be a non-empty list"),
        ({"tables": [t()], "unmapped": "drop"}, "unmapped: 'drop' must be 'dlq' or 'skip'"),
        ({"tables": [t()], "extra": 1}, "extra: unknown key"),
        ({"tables": [t(topic=None)]}, "tables[0]: needs 'topic'"),
        (
            {"tables": [t(topic="orders")]},
            "tables[0].topic: 'orders' must be a topic name starting with 'cdc.raw.'",
        ),
        ({"tables": [t(world="Prod!")]}, "tables[0].world:"),
        ({"tables": [t(world={"col": "x"})]}, "tables[0].world: use a world id, or {column: <column name>}"),
        ({"tables": [t(object_type=None)]}, "exactly one of 'object_type' or 'link'"),
        ({"tables": [t(link={})]}, "exactly one of 'object_type' or 'link'"),
        ({"tables": [t(object_type=None, link=LINK)]}, "tables[0].link: must be {type"),
        ({"tables": [t(pk=None)]}, "tables[0].pk: must be a column"),
        ({"tables": [t(pk=[])]}, "tables[0].pk"),
        ({"tables": [t(pk=["a", "a"])]}, "twice"),
        ({"tables": [t(object_type="has space")]}, "tables[0].object_type"),
        ({"tables": [t(rename={"x": "y", "z": "y"})]}, "renamed to the same property"),
        ({"tables": [t(rename=["x"])]}, "tables[0].rename"),
        ({"tables": [t(column_types={"p": "money"})]}, "tables[0].column_types.p: unknown column type"),
        ({"tables": [t(truncate_worlds=["x"])]}, "only for a world taken from a column"),
        ({"tables": [t(world={"column": "c"}, truncate_worlds=["BAD W"])]}, "tables[0].truncate_worlds[0]"),
        (
            {"tables": [t(topic=None, source={"db": "erp"})]},
            "tables[0].source: must be a mapping with at least",
        ),
        ({"tables": [t(source={"table": "t", "host": "h"})]}, "tables[0].source.host: unknown key"),
        ({"tables": [t(schema_version=-1)]}, "schema_version"),
        (
            {"tables": [t(), t(object_type="B")]},
            "tables[1].topic: 'cdc.raw.erp.orders' is already mapped by tables[0]",
        ),
        (
            {"tables": [t(topic=None, source={"table": "x"}), t(topic=None, source={"table": "x"})]},
            "already mapped",
        ),
    ],
)
def test_invalid_configs_name_the_problem(doc: Any, fragment: str) -> None:
    with pytest.raises(MappingError) as exc:
        parse_mapping(doc)
    assert fragment in str(exc.value), str(exc.value)


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(MappingError) as exc:
        load_mapping({"tables": [{"topic": "x", "world": 5, "object_type": "A"}], "unmapped": "?"})
    assert len(exc.value.problems) >= 4


def test_load_from_yaml_json_inline_and_env(tmp_path: Path) -> None:
    yml = tmp_path / "m.yaml"
    yml.write_text(
        "unmapped: skip\ntables:\n  - topic: cdc.raw.erp.orders\n    world: prod\n    object_type: Order\n    pk: id\n"
    )
    m = load_mapping(yml)
    assert m.unmapped == "skip" and m.tables[0].pk == ("id",)
    js = tmp_path / "m.json"
    js.write_text(json.dumps({"tables": [{"topic": TOPIC, "world": "prod", "object_type": "Order", "pk": "id"}]}))
    assert load_mapping(str(js)).tables[0].entity_type == "Order"
    inline = json.dumps({"tables": [{"topic": TOPIC, "world": "w1", "object_type": "O", "pk": ["a", "b"]}]})
    assert load_cdc_mapping(Settings.from_env({"CAUSEWAY_CDC_MAPPING": inline})).tables[0].world == "w1"
    assert load_cdc_mapping(Settings.from_env({"CAUSEWAY_CDC_MAPPING": str(yml)})).unmapped == "skip"
    with pytest.raises(MappingError, match="CAUSEWAY_CDC_MAPPING is not set"):
        load_cdc_mapping(Settings.from_env({}))
    with pytest.raises(MappingError, match="cannot read the file"):
        load_mapping(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables: [unclosed\n")
    with pytest.raises(MappingError, match="does not parse"):
        load_mapping(bad)


def test_lookup_topic_wins_then_source_in_order() -> None:
    m = load_mapping(
        {
            "tables": [
                {
                    "source": {"db": "erp", "table": "orders"},
                    "world": "w-src",
                    "object_type": "A",
                    "pk": "id",
                },
                {"source": {"table": "orders"}, "world": "w-any", "object_type": "B", "pk": "id"},
                {"topic": TOPIC, "world": "w-topic", "object_type": "C", "pk": "id"},
            ]
        }
    )
    pl = payload("c", after=order())
    assert single(pl, m).world_id == "w-topic"
    assert single(pl, m, Position("cdc.raw.other.orders", 0, 1)).world_id == "w-src"
    other_db = payload("c", after=order(), source=pg_source(db="crm"))
    assert single(other_db, m, Position("cdc.raw.other.orders", 0, 1)).world_id == "w-any"


def test_unmapped_policy() -> None:
    pl = orjson.dumps(payload("c", after=order(), source=pg_source(table="invoices")))
    pos = Position("cdc.raw.erp.invoices", 0, 0)
    dlq = mapping()
    rej = convert(pl, dlq, pos)
    assert isinstance(rej, Rejected) and rej.reason == "unmapped-table"
    skip = load_mapping(
        {"unmapped": "skip", "tables": [{"topic": TOPIC, "world": "p", "object_type": "O", "pk": "id"}]}
    )
    assert convert(pl, skip, pos) == Ignored("unmapped")


# --- conversion ----------------------------------------------------------------------------------


def test_ops_become_change_types() -> None:
    m = mapping()
    c = single(wrap(payload("c", after=order())), m)
    assert c.change_type is ChangeType.CREATE and c.before is None
    assert c.after == {"id": 7, "customer": "acme", "total": "12.30"}
    assert c.key == "prod::7" and c.kind is EntityKind.OBJECT and c.entity_type == "Order"
    assert c.occurred_at_ms == TS and c.version == 24023128
    u = single(wrap(payload("u", before=order(total="1.00"), after=order())), m)
    assert u.change_type is ChangeType.UPDATE and u.before is not None and u.before["total"] == "1.00"
    d = single(wrap(payload("d", before=order())), m)
    assert d.change_type is ChangeType.DELETE and d.after is None and d.entity_pk == "7"
    r = single(wrap(payload("r", after=order(), source=pg_source(snapshot="true"))), m)
    assert r.change_type is ChangeType.SNAPSHOT
    assert len({c.event_id, u.event_id, d.event_id, r.event_id}) == 4


def test_events_satisfy_the_change_event_contract() -> None:
    m = mapping()
    for op, before, after in [
        ("c", None, order()),
        ("u", order(), order()),
        ("d", order(), None),
        ("t", None, None),
    ]:
        (ev,) = events(wrap(payload(op, before, after)), m)
        back = decode(ev.value, ev.key, EntityKind.OBJECT)
        assert back == ev.event


def test_composite_pk_escaping() -> None:
    m = mapping(pk=["region", "code"])
    ev = single(payload("c", after={"region": "eu|west", "code": "a\\b"}), m)
    assert ev.entity_pk == "eu\\|west|a\\\\b"
    assert join_pk(["a", "b"]) == "a|b"
    assert join_pk(["a|b"]) == "a|b"  # a single column is used as it is
    assert join_pk(["a|", "b"]) != join_pk(["a", "|b"])


@given(
    st.lists(st.text(max_size=6), min_size=2, max_size=4),
    st.lists(st.text(max_size=6), min_size=2, max_size=4),
)
def test_composite_pk_is_injective(a: list[str], b: list[str]) -> None:
    if len(a) == len(b) and a != b:
        assert join_pk(a) != join_pk(b)


def test_pk_text_of_typed_values() -> None:
    fields = [
        field("day", "int32", optional=False, logical="io.debezium.time.Date"),
        field("n", "int64", optional=False),
        field("flag", "boolean", optional=False),
        field("amount", "bytes", optional=False, logical="org.apache.kafka.connect.data.Decimal", scale="1"),
    ]
    m = mapping(pk=["day", "n", "flag", "amount"])
    ev = single(wrap(payload("c", after={"day": 20468, "n": 5, "flag": True, "amount": dec_b64("2.5", 1)}), fields), m)
    assert ev.entity_pk == "2026-01-15|5|true|2.5"


def test_renames_apply_to_both_images_and_unchanged() -> None:
    fields = [field("id", "int32", optional=False), field("customer", "string"), field("notes", "string")]
    m = mapping(rename={"customer": "customer_name", "notes": "remarks"})
    (ev,) = events(
        wrap(payload("u", before={"id": 1, "customer": "a", "notes": "n"},
                     after={"id": 1, "customer": "b", "notes": UNAVAILABLE_PLACEHOLDER}), fields),
        m,
    )  # fmt: skip
    assert ev.event.before == {"id": 1, "customer_name": "a", "remarks": "n"}
    assert ev.event.after == {"id": 1, "customer_name": "b"}
    assert ev.unchanged == ("remarks",)
    assert orjson.loads(ev.value)["unchanged_properties"] == ["remarks"]


def test_rename_collision_is_rejected() -> None:
    m = mapping(rename={"customer": "total"})
    rej = convert(orjson.dumps(payload("c", after={"id": 1, "customer": "a", "total": "1"})), m, POS)
    assert isinstance(rej, Rejected) and rej.reason == "rename-collision"


def test_world_from_column() -> None:
    m = mapping(world={"column": "tenant"})
    ev = single(payload("c", after={"id": 1, "tenant": "acme"}), m)
    assert ev.world_id == "acme" and ev.key == "acme::1"
    d = single(payload("d", before={"id": 1, "tenant": "acme"}), m)
    assert d.world_id == "acme"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"id": 1}, "missing-world-column"),
        ({"id": 1, "tenant": None}, "null-world"),
        ({"id": 1, "tenant": "Not A World"}, "bad-world-id"),
    ]
    for after, reason in cases:
        rej = convert(orjson.dumps(payload("c", after=after)), m, POS)
        assert isinstance(rej, Rejected) and rej.reason == reason


def test_pk_change_with_a_partial_before_image_keeps_the_new_world() -> None:
    m = mapping(world={"column": "tenant"})
    old, new = events(payload("u", before={"id": 1, "tenant": None}, after={"id": 2, "tenant": "acme"}), m)
    assert (old.event.world_id, old.event.entity_pk, new.event.world_id) == ("acme", "1", "acme")


def test_tenant_move_with_replica_identity_full_deletes_the_row_in_the_old_world() -> None:
    m = mapping(world={"column": "tenant"})
    before, after = {"id": 1, "tenant": "acme"}, {"id": 1, "tenant": "globex"}
    result = convert(orjson.dumps(payload("u", before=before, after=after)), m, POS)
    assert isinstance(result, Converted) and result.world_unchecked is None
    old, new = (e.event for e in result.events)
    assert (old.change_type, old.world_id, old.entity_pk) == (ChangeType.DELETE, "acme", "1")
    assert (new.change_type, new.world_id, new.entity_pk) == (ChangeType.CREATE, "globex", "1")


def test_tenant_move_without_a_before_image_cannot_be_seen_and_is_flagged() -> None:
    """REPLICA IDENTITY DEFAULT: ``before`` is null, so the old world is unknown (docs/cdc.md says so)."""
    m = mapping(world={"column": "tenant"})
    result = convert(orjson.dumps(payload("u", after={"id": 1, "tenant": "globex"})), m, POS)
    assert isinstance(result, Converted)
    (ev,) = result.events
    assert (ev.event.change_type, ev.event.world_id) == (ChangeType.UPDATE, "globex")  # no delete in acme
    assert result.world_unchecked == "tables[0]"
    # A fixed world, or a create, has nothing to check.
    fixed = convert(orjson.dumps(payload("u", after={"id": 1, "tenant": "globex"})), mapping(), POS)
    created = convert(orjson.dumps(payload("c", after={"id": 1, "tenant": "globex"})), m, POS)
    assert isinstance(fixed, Converted) and fixed.world_unchecked is None
    assert isinstance(created, Converted) and created.world_unchecked is None


def test_pk_change_in_one_update_deletes_old_and_creates_new() -> None:
    m = mapping()
    old, new = events(payload("u", before={"id": 1, "customer": "a"}, after={"id": 2, "customer": "a"}), m)
    assert (old.event.change_type, old.event.entity_pk) == (ChangeType.DELETE, "1")
    assert (new.event.change_type, new.event.entity_pk) == (ChangeType.CREATE, "2")
    assert old.event.event_id != new.event.event_id


def test_links() -> None:
    m = load_mapping(
        {"tables": [{"topic": TOPIC, "world": "prod", "link": {"type": "Supplies", "from": "supplier",
                     "to": ["part", "rev"]}, "pk": ["supplier", "part", "rev"]}]}
    )  # fmt: skip
    (ev,) = events(payload("c", after={"supplier": "s1", "part": "p1", "rev": 2, "qty": 5}), m)
    e = ev.event
    assert e.kind is EntityKind.LINK and e.entity_type == "Supplies"
    assert (e.entity_pk, e.from_pk, e.to_pk) == ("s1|p1|2", "s1", "p1|2")
    assert orjson.loads(ev.value)["link_pk"] == "s1|p1|2"
    assert decode(ev.value, ev.key, EntityKind.LINK) == e
    # a delete whose before image lacks a link end still goes through (ends are optional on deletes)
    m2 = load_mapping(
        {"tables": [{"topic": TOPIC, "world": "prod", "link": {"type": "L", "from": "a", "to": "b"}, "pk": "id"}]}
    )
    (d,) = events(payload("d", before={"id": 9}), m2)
    assert (d.event.change_type, d.event.from_pk, d.event.to_pk) == (ChangeType.DELETE, None, None)
    rej = convert(orjson.dumps(payload("c", after={"id": 9, "a": "x"})), m2, POS)
    assert isinstance(rej, Rejected) and rej.reason == "missing-link-end-column"


def test_truncate_one_event_per_world() -> None:
    (t,) = events(payload("t"), mapping())
    assert (t.event.change_type, t.event.entity_pk, t.event.key) == (ChangeType.TRUNCATE, "*", "prod::*")
    m = mapping(world={"column": "tenant"}, truncate_worlds=["acme", "globex"])
    ts = events(payload("t"), m)
    assert [e.event.world_id for e in ts] == ["acme", "globex"]
    assert len({e.event.event_id for e in ts}) == 2
    rej = convert(orjson.dumps(payload("t")), mapping(world={"column": "tenant"}), POS)
    assert isinstance(rej, Rejected) and rej.reason == "truncate-world-unknown"


# --- versions and ids ----------------------------------------------------------------------------


def src(**kw: Any) -> SourceInfo:
    base: dict[str, Any] = {"connector": "x", "name": "n", "db": "d", "schema": None, "table": "t",
                            "ts_ms": TS, "snapshot": None}  # fmt: skip
    base.update(kw)
    return SourceInfo(**base)


def test_versions_from_source_positions() -> None:
    assert source_version(src(lsn=100)) == (100, "lsn:100")
    v3, p3 = source_version(src(binlog_file="mysql-bin.000003", binlog_pos=154, binlog_row=1))
    v4, _ = source_version(src(binlog_file="mysql-bin.000004", binlog_pos=4))
    assert v3 == (3 << 40) + 154 and p3 == "binlog:mysql-bin.000003:154:1"
    assert v4 is not None and v4 > v3
    assert source_version(src(scn=123456)) == (123456, "scn:123456")
    v_sql, p_sql = source_version(
        src(change_lsn="00000027:00000758:0005", commit_lsn="00000027:00000758:0007", event_serial_no=1)
    )
    assert v_sql == (0x27 << 48) | (0x758 << 16) | 5
    assert p_sql == "sqlserver:00000027:00000758:0007:00000027:00000758:0005:1"
    # no source position: time-based, with the Kafka offset breaking ties inside one microsecond
    assert source_version(src(ts_us=TS * 1000 + 7), offset=3) == (((TS * 1000 + 7) << 12) | 3, None)
    assert source_version(src(ts_ns=TS * 1_000_000 + 7000)) == ((TS * 1000 + 7) << 12, None)
    assert source_version(src(), offset=4097) == (((TS * 1000) << 12) | 1, None)
    assert source_version(src(ts_ms=None)) == (None, None)
    same_ms = [source_version(src(), offset=o)[0] or 0 for o in (10, 11, 12)]
    assert same_ms == sorted(same_ms) and len(set(same_ms)) == 3
    assert all(0 < v < 2**63 for v in same_ms)


def test_mysql_versions_increase_along_the_binlog() -> None:
    m = mapping()
    positions = [("mysql-bin.000003", 154), ("mysql-bin.000003", 9000), ("mysql-bin.000004", 4)]
    versions = [
        single(payload("u", after=order(), source=mysql_source(file=f, pos=p)), m).version for f, p in positions
    ]
    assert versions == sorted(versions) and len(set(versions)) == 3


def test_event_ids_are_deterministic() -> None:
    m = mapping()
    pl = wrap(payload("u", before=order(total="1.00"), after=order()))
    first = events(pl, m)
    again = events(pl, m, Position(TOPIC, 0, 999))  # redelivered, even from elsewhere: same id and bytes
    assert [e.event.event_id for e in first] == [e.event.event_id for e in again]
    assert first[0].value == again[0].value
    # position, pk, op, table and world each change the id
    ids = {
        first[0].event.event_id,
        single(payload("u", after=order(), source=pg_source(lsn=24023129)), m).event_id,
        single(payload("u", after=order(id_=8)), m).event_id,
        single(payload("r", after=order()), m).event_id,
        single(payload("u", after=order(), source=pg_source(table="orders2")), m).event_id,
        single(payload("u", after=order()), mapping(world="staging")).event_id,
    }
    assert len(ids) == 6


def test_without_a_source_position_the_kafka_position_makes_the_id() -> None:
    m = mapping()
    db2 = {"connector": "db2", "name": "s", "db": "d", "schema": "S", "table": "orders", "ts_ms": TS}
    pl = payload("u", after=order(), source=db2)
    a, b = single(pl, m, Position(TOPIC, 0, 1)), single(pl, m, Position(TOPIC, 0, 1))
    c = single(pl, m, Position(TOPIC, 0, 2))
    assert a.event_id == b.event_id != c.event_id
    assert a.version == ((TS * 1000) << 12) | 1 and c.version > a.version
    assert a.source.endswith("@kafka:cdc.raw.erp.orders:0:1")


def test_sqlserver_ids_do_not_depend_on_the_kafka_position() -> None:
    m = mapping()
    sqlserver = {
        "connector": "sqlserver",
        "name": "s",
        "db": "d",
        "schema": "dbo",
        "table": "orders",
        "ts_ms": TS,
        "change_lsn": "00000027:00000758:0005",
        "commit_lsn": "00000027:00000758:0007",
        "event_serial_no": 1,
    }
    pl = payload("u", after=order(), source=sqlserver)
    a, c = single(pl, m, Position(TOPIC, 0, 1)), single(pl, m, Position(TOPIC, 3, 2))
    assert a.event_id == c.event_id and a.version == c.version


def test_schema_version_and_source_label() -> None:
    ev = single(payload("c", after=order()), mapping(schema_version=3))
    assert ev.schema_version == 3
    assert ev.source == "debezium:postgresql:erp:erp.public.orders@lsn:24023128"


def test_payload_only_with_column_type_hints() -> None:
    m = mapping(column_types={"total": "decimal:2"})
    assert single(payload("c", after=order(total="3.10")), m).after == {
        "id": 7,
        "customer": "acme",
        "total": "3.10",
    }


def test_ingest_tunables_from_env_and_the_default_pattern() -> None:
    import re

    s = Settings.from_env(
        {
            "CAUSEWAY_CDC_MAX_RECORDS": "40",
            "CAUSEWAY_CDC_ENSURE_TOPICS": "false",
            "CAUSEWAY_CDC_LINGER_MS": "0",
        }
    )
    assert (s.cdc_max_records, s.cdc_ensure_topics, s.cdc_linger_ms) == (40, False, 0)
    default = Settings.from_env({}).cdc_pattern
    assert re.match(default, "cdc.raw.erp.orders")
    assert not re.match(default, "cdc.rawx.orders") and not re.match(default, "onto.changes.objects")
