"""Offset sets built from ranges and parsed from text the fast way equal one insert per offset or range;
the per-branch memo of the last map written answers like a parse of its text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sinks.committed_offsets
from sinks.committed_offsets import MapMemo, OffsetSet, dumps_map, loads_map, merge_maps
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


_SPANS = st.lists(st.tuples(st.integers(0, 120), st.integers(0, 4)), max_size=25)


@given(_SPANS, st.integers(0, 40), _SPANS, st.integers(0, 40))
def test_a_union_merged_in_one_pass_holds_what_one_insert_per_range_holds(
    held: list[tuple[int, int]], held_floor: int, added: list[tuple[int, int]], added_floor: int
) -> None:
    def inserted(spans: list[tuple[int, int]], floor: int) -> OffsetSet:
        s = OffsetSet(floor=floor)
        for a, n in spans:
            s.add_range(a, a + n)
        return s

    other = inserted(added, added_floor)
    merged = inserted(held, held_floor)
    merged.update(other)
    expected = inserted(held, held_floor)
    expected.raise_floor(other.floor)
    for a, b in other.ranges:
        expected.add_range(a, b)
    assert merged == expected
    members = {o for o in range(200) if o in merged}
    assert members == {o for o in range(200) if o in expected}


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


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 300), st.integers(0, 4)), max_size=40),
    st.dictionaries(st.integers(0, 2), st.integers(0, 200), max_size=3),
)
def test_the_memo_answers_a_written_map_exactly_like_parsing_its_text(
    spans: list[tuple[int, int, int]], floors: dict[int, int]
) -> None:
    added: dict[tuple[str, int], OffsetSet] = {}
    for p, a, n in spans:
        added.setdefault(("t", p), OffsetSet()).add_range(a, a + n)
    merged = merge_maps({}, added, {("t", p): f for p, f in floors.items()})
    memo = MapMemo()
    text = memo.dumps("world-a", merged)
    assert text == dumps_map(merged)
    served = memo.loads("world-a", text)
    parsed = loads_map(text)
    assert served == parsed and dumps_map(served) == text  # the same sets, in the same form


def test_a_branchs_next_read_of_the_text_it_wrote_parses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = MapMemo()
    written = {("t", 0): OffsetSet(10, [(12, 15)]), ("t", 1): OffsetSet(0, [(3, 3)])}
    text = memo.dumps("world-a", written)
    other = dumps_map({("t", 0): OffsetSet(20)})
    parsed: list[str | None] = []
    real = loads_map
    monkeypatch.setattr(sinks.committed_offsets, "loads_map", lambda t: (parsed.append(t), real(t))[1])

    first = memo.loads("world-a", text)
    assert parsed == [] and first == written
    first[("t", 0)].add(16)  # a caller's change never reaches the memo
    assert memo.loads("world-a", text) == written and parsed == []
    # Another text (another writer moved the branch, or a failed attempt's text), another branch,
    # or nothing remembered: parsed.
    assert memo.loads("world-a", other) == {("t", 0): OffsetSet(20)}
    assert memo.loads("world-b", text) == written
    assert memo.loads("world-a", None) == {}
    assert parsed == [other, text, None]


def test_the_memo_forgets_the_least_recently_used_branches_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = MapMemo(max_branches=2)
    texts = {b: memo.dumps(b, {("t", 0): OffsetSet(n)}) for n, b in enumerate(("a", "b", "c"), start=1)}
    parsed: list[str | None] = []
    real = loads_map
    monkeypatch.setattr(sinks.committed_offsets, "loads_map", lambda t: (parsed.append(t), real(t))[1])
    for b in ("a", "b", "c"):
        assert memo.loads(b, texts[b]) == {("t", 0): OffsetSet(" abc".index(b))}
    assert parsed == [texts["a"]]
