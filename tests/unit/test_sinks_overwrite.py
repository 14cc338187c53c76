"""sinks/overwrite.py: rows are put in the table's sort order before they are written."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import BucketTransform, IdentityTransform, Transform
from pyiceberg.types import IntegerType, NestedField, StringType

from sinks.overwrite import in_sort_order

SCHEMA = Schema(
    NestedField(1, "kind", StringType(), required=False),
    NestedField(2, "pk", StringType(), required=False),
    NestedField(3, "n", IntegerType(), required=False),
)
DATA = pa.table({"kind": ["b", None, "a", "b", "a"], "pk": ["2", "9", "3", "1", "4"], "n": [1, 2, 3, 4, 5]})


def _field(
    source_id: int,
    direction: SortDirection = SortDirection.ASC,
    nulls: NullOrder = NullOrder.NULLS_LAST,
    transform: Transform[Any, Any] | None = None,
) -> SortField:
    return SortField(
        source_id=source_id, transform=transform or IdentityTransform(), direction=direction, null_order=nulls
    )


def test_rows_follow_the_order_direction_and_null_order_of_each_field() -> None:
    asc = in_sort_order(DATA, SortOrder(_field(1), _field(2)), SCHEMA)
    assert asc.column("n").to_pylist() == [3, 5, 4, 1, 2]  # a3 a4 b1 b2, then the null kind
    mixed = in_sort_order(
        DATA, SortOrder(_field(1, nulls=NullOrder.NULLS_FIRST), _field(2, SortDirection.DESC)), SCHEMA
    )
    assert mixed.column("n").to_pylist() == [2, 5, 3, 1, 4]


def test_a_transformed_field_ends_the_keys_and_an_unsorted_table_keeps_the_rows_as_given() -> None:
    by_kind_only = in_sort_order(DATA, SortOrder(_field(1), _field(2, transform=BucketTransform(4))), SCHEMA)
    assert by_kind_only.column("n").to_pylist() == [3, 5, 1, 4, 2]  # stable within a kind
    assert in_sort_order(DATA, SortOrder(_field(2, transform=BucketTransform(4)), _field(1)), SCHEMA) is DATA
    assert in_sort_order(DATA, SortOrder(order_id=0), SCHEMA) is DATA
