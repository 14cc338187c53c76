"""Offset sets built from ranges and parsed from text the fast way equal one insert per offset or range."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sinks.committed_offsets import OffsetSet
from sinks.committer import Batch, Source
from tests.factories import change_event


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 60)), max_size=80))
def test_batch_offsets_equal_one_insert_per_offset(sources: list[tuple[int, int]]) -> None:
    event = change_event("e", entity_type="Person", after={"v": 1})
    batch = Batch.from_sources("w1", "b", [(event, Source("t", p, o)) for p, o in sources])
    expected: dict[tuple[str, int], OffsetSet] = {}
    for p, o in sources:
        expected.setdefault(("t", p), OffsetSet()).add(o)
    assert batch.offsets == expected


@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 5)), max_size=30),
    st.integers(0, 50),
)
def test_parse_reads_any_range_text_like_one_insert_per_range(spans: list[tuple[int, int]], floor: int) -> None:
    # Sorted disjoint text (what format writes) takes the fast path; anything else the slow one.
    for ranges in (sorted(spans), spans):
        text = ",".join(f"{a}-{a + n}" for a, n in ranges)
        expected = OffsetSet(floor=floor)
        for a, n in ranges:
            expected.add_range(a, a + n)
        assert OffsetSet.parse(text, floor=floor) == expected
    written = OffsetSet(floor=floor)
    for a, n in spans:
        written.add_range(a, a + n)
    assert OffsetSet.parse(written.format(), floor=written.floor) == written
