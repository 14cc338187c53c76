"""The diff core: which files to read, entity and property changes, schema changes (pure)."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from worlds.diff import entity_changes, plan_reads, schema_diff


def pos(*p: int) -> pa.Array:
    return pa.array(list(p), pa.int64())


def test_plan_reads_skips_shared_files_with_equal_deletes() -> None:
    a = {"f1": None, "f2": pos(1), "f3": pos(4, 2), "fa": None}
    b = {"f1": None, "f2": pos(1, 5), "f3": pos(2, 4), "fb": None}
    plan = plan_reads(a, b)
    assert sorted(plan.skipped) == ["f1", "f3"]  # same positions in another order: same rows
    reads = {r.path: r for r in plan.reads}
    assert set(reads) == {"f2", "fa", "fb"}
    assert reads["fa"].whole_a and not reads["fa"].whole_b and reads["fb"].whole_b
    assert reads["f2"].a_positions.to_pylist() == [5] and reads["f2"].b_positions.to_pylist() == []


def rows(*r: tuple[str, int, bool, str | None]) -> pa.Table:
    return pa.table(
        {
            "object_type_id": ["person"] * len(r),
            "object_pk": [x[0] for x in r],
            "version": pa.array([x[1] for x in r], pa.int64()),
            "deleted": [x[2] for x in r],
            "properties": [x[3] for x in r],
        }
    )


def test_entity_changes_added_removed_modified_with_property_values() -> None:
    a = rows(("p1", 1, False, '{"n":1,"x":"a"}'), ("p2", 1, False, "{}"), ("p3", 1, False, '{"n":3}'))
    b = rows(
        ("p1", 2, False, '{"n":2,"x":"a","y":true}'),
        ("p2", 2, True, None),  # tombstone: removed
        ("p3", 1, False, '{"n":3}'),  # same row (e.g. rewritten by compaction): no change
        ("p4", 1, False, '{"k":1}'),
    )
    out = {c.pk: c for c in entity_changes("object", a, b, "object_type_id", "object_pk")}
    assert set(out) == {"p1", "p2", "p4"}
    assert out["p2"].change == "removed" and out["p4"].change == "added"
    p1 = out["p1"]
    assert p1.change == "modified" and (p1.version_before, p1.version_after) == (1, 2)
    assert [(p.name, p.before, p.after) for p in p1.properties] == [("n", 1, 2), ("y", None, True)]
    assert entity_changes("object", None, None, "object_type_id", "object_pk") == []
    assert [c.change for c in entity_changes("object", None, a, "object_type_id", "object_pk")] == ["added"] * 3


def test_schema_diff_by_field_id() -> None:
    a = Schema(NestedField(1, "pk", StringType(), required=True), NestedField(2, "n", IntegerType()))
    b = Schema(
        NestedField(1, "pk", StringType(), required=True),
        NestedField(2, "count", LongType()),
        NestedField(3, "extra", StringType()),
    )
    out = [(s.change, s.column) for s in schema_diff(a, b)]
    assert out == [("renamed", "count"), ("widened", "count"), ("added", "extra")]
    assert [s.change for s in schema_diff(b, None)] == ["removed"] * 3
