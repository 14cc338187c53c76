"""A batch's exact offsets are built from ranges, and equal the set of its sources' offsets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sinks.committer import Batch, Source
from sinks.offsets import OffsetSet
from tests.unit.test_dedupe import arrival


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 60)), max_size=80))
def test_batch_offsets_equal_one_insert_per_offset(sources: list[tuple[int, int]]) -> None:
    event = arrival("e").event
    batch = Batch.from_sources("w1", "b", [(event, Source("t", p, o)) for p, o in sources])
    expected: dict[tuple[str, int], OffsetSet] = {}
    for p, o in sources:
        expected.setdefault(("t", p), OffsetSet()).add(o)
    assert batch.offsets == expected
