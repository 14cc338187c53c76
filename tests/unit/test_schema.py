"""The schema contract, typed-column conversion and reconciliation's pure comparison."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from types import SimpleNamespace

import pyarrow as pa
import pytest

from agents.reconcile import Row, compare, decode_count, derive, expected, latest_counts
from models.events import EntityKind, Invalid
from models.schema import (
    AddColumn,
    PropType,
    RenameColumn,
    SchemaChange,
    SchemaRefused,
    TypeSchema,
    Verdict,
    VersionVector,
    WidenColumn,
    check_widening,
    column_name,
    decide,
    decode_change,
    validate_change,
)
from sinks.rows import coerce


def change(version: int, *ops: dict[str, object], world: str = "w1") -> SchemaChange:
    doc = {
        "change_id": f"c{version}",
        "world_id": world,
        "kind": "object",
        "type_name": "Equipment",
        "version": version,
        "occurred_at": "2026-01-01T00:00:00Z",
        "changes": list(ops),
    }
    return validate_change(doc)


def add(pid: str, name: str, typ: str) -> dict[str, object]:
    return {"op": "add", "id": pid, "name": name, "type": typ}


def applied(*changes: SchemaChange) -> TypeSchema:
    cur: TypeSchema | None = None
    for c in changes:
        d = decide(cur, c)
        assert d.verdict is Verdict.APPLY
        cur = d.schema
    assert cur is not None
    return cur


def test_add_rename_widen_deprecate_produce_column_ops() -> None:
    v1 = change(1, add("p1", "status", "string"), add("p2", "temp", "int"))
    d1 = decide(None, v1)
    assert [type(o) for o in d1.ops] == [AddColumn, AddColumn]
    assert [o.column for o in d1.ops if isinstance(o, AddColumn)] == ["p_equipment__status", "p_equipment__temp"]
    v2 = change(2, {"op": "rename", "id": "p1", "name": "state"}, {"op": "widen", "id": "p2", "type": "long"})
    d2 = decide(d1.schema, v2)
    assert RenameColumn("p_equipment__status", "p_equipment__state") in d2.ops
    assert WidenColumn("p_equipment__temp", PropType.parse("long")) in d2.ops
    state = d2.schema.by_id("p1")
    assert state is not None and state.name == "state" and state.aliases == ("status",)
    d3 = decide(d2.schema, change(3, {"op": "deprecate", "id": "p2"}))
    assert d3.schema.by_id("p2").deprecated  # type: ignore[union-attr]
    assert TypeSchema.from_json(d3.schema.to_json()) == d3.schema


def test_versions_duplicate_and_gap() -> None:
    s = applied(change(1, add("p1", "a", "int")))
    assert decide(s, change(1, add("p1", "a", "int"))).verdict is Verdict.DUPLICATE
    assert decide(s, change(3, add("p9", "z", "int"))).verdict is Verdict.WAIT
    assert decide(None, change(2, add("p1", "a", "int"))).verdict is Verdict.WAIT


def rename(pid: str, name: str) -> dict[str, object]:
    return {"op": "rename", "id": pid, "name": name}


def test_a_name_that_is_or_was_another_propertys_is_refused_through_the_rename_history() -> None:
    """Issue 19.1: `pc` renamed to `temp`, the former name of `pt`, made {"temp": 7} fill both columns."""
    s = applied(
        change(1, add("pt", "temp", "int"), add("pc", "pc", "int")),
        change(2, rename("pt", "temperature")),  # pt: temp -> temperature
        change(3, rename("pt", "celsius")),  # pt: temperature -> celsius (aliases: temperature, temp)
    )
    assert s.by_id("pt").aliases == ("temperature", "temp")  # type: ignore[union-attr]
    for ops in ([rename("pc", "temp")], [rename("pc", "Temperature")], [add("px", "TEMP", "int")],
                [add("px", "temperature", "long")], [rename("pc", "celsius")]):  # fmt: skip
        with pytest.raises(SchemaRefused) as exc:
            decide(s, change(4, *ops))
        assert exc.value.reason in ("former-name", "duplicate-name"), ops
        assert exc.value.reason == ("duplicate-name" if ops[0].get("name") == "celsius" else "former-name")
        assert "pt" in exc.value.detail
    # A property may go back to one of its own former names; the name it leaves becomes reserved.
    back = applied(change(1, add("pt", "temp", "int"), add("pc", "pc", "int")), change(2, rename("pt", "t2")),
                   change(3, rename("pt", "temp")))  # fmt: skip
    assert back.by_id("pt").name == "temp" and back.by_id("pt").aliases == ("t2",)  # type: ignore[union-attr]
    with pytest.raises(SchemaRefused, match="former-name"):
        decide(back, change(4, rename("pc", "t2")))
    # A rename within one change: the freed name is still reserved for the rest of the change.
    with pytest.raises(SchemaRefused, match="former-name"):
        decide(back, change(4, rename("pt", "t3"), add("pn", "temp", "int")))


def test_duplicates_are_judged_by_change_id() -> None:
    """Issue 19.11: same change id -> duplicate; same version, other change id -> version-conflict."""
    s = applied(change(1, add("p1", "a", "int")), change(2, add("p2", "b", "int")))
    assert s.change_ids == ("c1", "c2") and TypeSchema.from_json(s.to_json()) == s
    assert decide(s, change(2, add("p2", "b", "int"))).verdict is Verdict.DUPLICATE
    other = validate_change({**change(2, add("p9", "z", "int")).to_wire(), "change_id": "another"})
    with pytest.raises(SchemaRefused) as exc:
        decide(s, other)
    assert exc.value.reason == "version-conflict" and "'c2'" in exc.value.detail
    reused = validate_change({**change(3, add("p9", "z", "int")).to_wire(), "change_id": "c1"})
    with pytest.raises(SchemaRefused, match="version-conflict"):
        decide(s, reused)
    # A contract written before change ids were kept: a version is all there is to compare.
    legacy = TypeSchema(s.kind, s.type_name, 2, s.properties)
    assert decide(legacy, other).verdict is Verdict.DUPLICATE
    assert decide(legacy, change(3, add("p3", "c", "int"))).schema.change_ids == ("", "", "c3")


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        ("long", "int", "narrowing"),
        ("double", "float", "narrowing"),
        ("decimal(10,2)", "decimal(8,2)", "narrowing"),
        ("decimal(10,2)", "decimal(12,3)", "incompatible-type"),
        ("string", "int", "incompatible-type"),
        ("int", "double", "incompatible-type"),
        ("int", "int", "not-a-widening"),
    ],
)
def test_incompatible_widenings_are_refused(old: str, new: str, reason: str) -> None:
    with pytest.raises(SchemaRefused) as exc:
        check_widening(PropType.parse(old), PropType.parse(new))
    assert exc.value.reason == reason


def test_widenings_allowed() -> None:
    for old, new in (("int", "long"), ("float", "double"), ("decimal(10,2)", "decimal(20,2)")):
        check_widening(PropType.parse(old), PropType.parse(new))


@pytest.mark.parametrize(
    ("ops", "reason"),
    [
        ([add("p1", "a", "int")], "duplicate-id"),
        ([add("p2", "A", "int")], "duplicate-name"),
        ([{"op": "rename", "id": "nope", "name": "b"}], "unknown-property"),
        ([add("p2", "b", "int"), {"op": "rename", "id": "p2", "name": "a"}], "duplicate-name"),
        ([{"op": "widen", "id": "p1", "type": "int"}], "narrowing"),
    ],
)
def test_refusals_name_the_reason(ops: list[dict[str, object]], reason: str) -> None:
    s = applied(change(1, add("p1", "a", "long")))
    with pytest.raises(SchemaRefused) as exc:
        decide(s, change(2, *ops))
    assert exc.value.reason == reason


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        (b"{", "malformed-json"),
        (b'{"change_id": "x"}', "bad-world-id"),
        (b'{"change_id":"x","world_id":"w","kind":"thing"}', "bad-kind"),
        (b'{"change_id":"x","world_id":"w","kind":"object","type_name":"a__b"}', "bad-name"),
        (b'{"change_id":"x","world_id":"w","kind":"object","type_name":"T","version":0}', "bad-version"),
        (b'{"change_id":"x","world_id":"w","kind":"object","type_name":"T","version":1,"changes":[]}', "no-changes"),
        (
            b'{"change_id":"x","world_id":"w","kind":"object","type_name":"T","version":1,'
            b'"changes":[{"op":"add","id":"p","name":"n","type":"varchar"}],"occurred_at":0}',
            "bad-type",
        ),
        (
            b'{"change_id":"x","world_id":"w","kind":"object","type_name":"T","version":1,'
            b'"changes":[{"op":"drop","id":"p"}],"occurred_at":0}',
            "unknown-op",
        ),
    ],
)
def test_decode_rejects_with_reasons(doc: bytes, reason: str) -> None:
    got = decode_change(doc)
    assert isinstance(got, Invalid) and got.reason == reason, got


def test_wire_round_trip_and_all_worlds() -> None:
    c = change(1, add("p1", "a", "decimal(10,2)"), world="*")
    assert decode_change(c.encode()) == c
    assert c.for_world("w2").world_id == "w2"
    assert c.kind is EntityKind.OBJECT


def test_column_names_are_unique_per_type_and_name() -> None:
    assert column_name("Equipment", "Status") == "p_equipment__status"
    assert column_name("a_b", "c") != column_name("a", "b_c")


def test_coerce_keeps_only_values_that_convert() -> None:
    assert coerce(5, PropType.parse("int")) == 5
    assert coerce(2**40, PropType.parse("int")) is None
    assert coerce(True, PropType.parse("int")) is None
    assert coerce("5", PropType.parse("int")) is None
    assert coerce(3, PropType.parse("double")) == 3.0
    assert coerce("1.5", PropType.parse("decimal(5,2)")) == Decimal("1.50")
    assert coerce(2, PropType.parse("decimal(5,2)")) == Decimal("2.00")
    assert coerce("12345.6", PropType.parse("decimal(5,2)")) is None
    assert coerce("2026-03-01", PropType.parse("date")) == date(2026, 3, 1)
    assert coerce(0, PropType.parse("timestamp")) == datetime(1970, 1, 1)  # no zone: the wall clock
    assert coerce(0, PropType.parse("timestamptz")) == datetime(1970, 1, 1, tzinfo=UTC)
    assert coerce(1, PropType.parse("string")) is None


def test_a_decimal_with_more_digits_than_the_scale_is_left_null_never_rounded() -> None:
    """Issue 19.3: "99.999" into decimal(12,2) was stored as 100.00."""
    dec = PropType.parse("decimal(12,2)")
    assert coerce("99.999", dec) is None
    assert coerce(99.999, dec) is None
    assert coerce("1.005", PropType.parse("decimal(5,2)")) is None
    assert coerce("99.990", dec) == Decimal("99.99")  # trailing zeros lose nothing
    assert coerce("NaN", dec) is None and coerce("Infinity", dec) is None


def test_values_left_null_are_counted_per_column() -> None:
    from collections import Counter

    from sinks.rows import typed_columns

    contract = applied(change(1, add("f", "flow", "decimal(12,2)"), add("n", "count", "int")))
    schema = pa.schema([("p_equipment__flow", pa.decimal128(12, 2)), ("p_equipment__count", pa.int32())])
    evs = [SimpleNamespace(entity_type="Equipment", after=a) for a in
           ({"flow": "99.999", "count": 1}, {"flow": "1.5", "count": "x"}, {"flow": None}, {})]  # fmt: skip
    counted: Counter[str] = Counter()
    cols = typed_columns(schema, {"Equipment": contract}, evs, [False] * 4, counted)  # type: ignore[arg-type]
    assert cols["p_equipment__flow"].to_pylist() == [None, Decimal("1.50"), None, None]
    assert counted == {"p_equipment__flow": 1, "p_equipment__count": 1}  # null and absent are not counted


def test_version_vector_difference_and_laggard() -> None:
    v = VersionVector()
    v.saw_control("object:A", 3)
    v.set_data("object:A", 1)
    v.intelligence = 1
    assert v.versions() == {"control": 3, "data": 1, "intelligence": 1}
    assert v.difference() == 2 and v.lagging() == "data"


def _log(pk: str, v: int, change_type: str = "UPDATE", t: str = "T") -> dict[str, object]:
    return {"entity_type": t, "entity_pk": pk, "change_type": change_type, "version": v, "event_id": f"{pk}{v}"}


def test_derive_replays_deletes_and_truncates() -> None:
    rows = [_log("a", 1), _log("b", 1), _log("a", 2), _log("c", 1, t="U"), _log("*", 0, "TRUNCATE"), _log("d", 1)]
    rows.append(_log("e", 1))
    rows.append(_log("e", 2, "DELETE"))
    want = expected(derive(rows))
    assert set(want) == {("U", "c"), ("T", "d"), ("T", "e")}
    assert want[("T", "e")] == Row(2, True, "e2")


def test_compare_reports_drift_and_repairs_only_past_threshold() -> None:
    want = {("T", "a"): Row(1, False, "a1"), ("T", "b"): Row(1, False, "b1"), ("T", "c"): Row(2, True, "c2")}
    proj = {("T", "a"): Row(1, False, "a1"), ("T", "x"): Row(1, False, "x1")}
    reports, write, remove = compare(proj, want, {"T": 2}, threshold=0)
    assert write == {("T", "b"), ("T", "c")} and remove == {("T", "x")}
    r = reports["T"]
    assert (r.control, r.projection, r.log, r.mismatched) == (2, 2, 2, 3) and r.drift == 3
    _, write2, remove2 = compare(proj, want, {"T": 2}, threshold=3)
    assert not write2 and not remove2
    _, write3, remove3 = compare(want, want, {"T": 2}, threshold=0)
    assert not write3 and not remove3


def test_count_checkpoints_latest_wins_and_bad_ones_say_why() -> None:
    a = decode_count(b'{"world_id": "w", "object_type": "T", "count": 3, "as_of": 10}')
    b = decode_count(b'{"world_id": "w", "object_type": "T", "count": 5, "as_of": 20}')
    assert not isinstance(a, Invalid) and not isinstance(b, Invalid)
    assert latest_counts([b, a]) == {"w": {"T": 5}}
    bad = decode_count(b'{"world_id": "w", "object_type": "T", "count": -1}')
    assert isinstance(bad, Invalid) and "count" in bad.detail
