"""Offset sets built from ranges and parsed from text the fast way equal one insert per offset or range;
the memo of what a writer last wrote per branch and partition answers like a parse of the text, and a
map moved by another writer is parsed only where this writer had not written it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the range text of every partition parsed from now on."""
    parsed: list[str] = []
    real = OffsetSet.parse.__func__  # type: ignore[attr-defined]

    def counting(cls: type[OffsetSet], text: str, floor: int = 0) -> OffsetSet:
        parsed.append(text)
        return real(cls, text, floor)

    monkeypatch.setattr(OffsetSet, "parse", classmethod(counting))
    return parsed


def test_a_branchs_next_read_of_the_text_it_wrote_parses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = MapMemo()
    written = {("t", 0): OffsetSet(10, [(12, 15)]), ("t", 1): OffsetSet(0, [(3, 3)])}
    text = memo.dumps("world-a", written)
    other = dumps_map({("t", 0): OffsetSet(20)})
    parsed = _count_parses(monkeypatch)

    first = memo.loads("world-a", text)
    assert first == written and parsed == []
    first[("t", 0)].add(16)  # a caller's change never reaches the memo
    assert memo.loads("world-a", text) == written and parsed == []
    # Another entry (another writer moved the branch, or a failed attempt's text), another branch,
    # or nothing remembered: parsed.
    assert memo.loads("world-a", other) == {("t", 0): OffsetSet(20)}
    assert memo.loads("world-b", text) == written
    assert memo.loads("world-a", None) == {}
    assert sorted(parsed) == ["", "12-15", "3"]


def test_a_map_another_writer_moved_is_parsed_only_where_this_writer_had_not_written_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two workers commit one world; each owns two partitions. A commit of worker A reads the map
    # worker B wrote last: A's own entries are still what A wrote (served from its memo), and B's
    # are never parsed, only carried to the map A writes.
    a, b = MapMemo(), MapMemo()
    mine, theirs = [("t", 0), ("t", 1)], [("t", 2), ("t", 3)]
    text = a.dumps("w", merge_maps({}, {tp: OffsetSet(0, [(5, 5), (9, 12)]) for tp in mine}, dict.fromkeys(mine, 2)))
    text = b.dumps("w", merge_maps(b.loads("w", text), {tp: OffsetSet(0, [(7, 7), (30, 31)]) for tp in theirs}))
    parsed = _count_parses(monkeypatch)

    committed = a.loads("w", text)
    assert 9 in committed[("t", 0)] and 13 not in committed[("t", 0)]
    merged = merge_maps(committed, {("t", 0): OffsetSet.of([40, 41])}, {("t", 0): 3, ("t", 1): 3})
    written = a.dumps("w", merged)
    assert parsed == []
    expected = merge_maps(loads_map(text), {("t", 0): OffsetSet.of([40, 41])}, {("t", 0): 3, ("t", 1): 3})
    assert written == dumps_map(dict(expected.items())) and loads_map(written) == expected
    assert loads_map(written)[("t", 2)] == OffsetSet(0, [(7, 7), (30, 31)])


@given(
    st.lists(
        st.tuples(
            st.sampled_from("ab"),
            st.lists(st.tuples(st.integers(0, 3), st.integers(0, 400), st.integers(0, 3)), max_size=6),
            st.dictionaries(st.integers(0, 3), st.integers(0, 300), max_size=2),
        ),
        max_size=12,
    )
)
def test_writers_taking_turns_on_a_branch_write_what_parsing_every_map_whole_writes(
    turns: list[tuple[str, list[tuple[int, int, int]], dict[int, int]]],
) -> None:
    # Any order of commits by two writers, any partitions each touches (owned or not): the text
    # each commit writes equals the one written by parsing the whole map, merging and formatting it.
    memos = {"a": MapMemo(), "b": MapMemo()}
    text: str | None = None
    for who, spans, floors in turns:
        added: dict[tuple[str, int], OffsetSet] = {}
        for p, start, n in spans:
            added.setdefault(("t", p), OffsetSet()).add_range(start, start + n)
        settled = {("t", p): f for p, f in floors.items()}
        committed = memos[who].loads("w", text)
        assert committed == loads_map(text)
        for tp in added:  # what the committer asks of the map (``_split``)
            assert (tp in committed and 5 in committed[tp]) == (tp in _model(text) and 5 in _model(text)[tp])
        expected = _model(text)
        for tp in added.keys() | settled.keys():
            held = expected.get(tp, OffsetSet())
            s = OffsetSet(floor=max(held.floor, added[tp].floor if tp in added else 0, settled.get(tp, 0)))
            for a, b in held.ranges + (added[tp].ranges if tp in added else []):
                s.add_range(a, b)
            expected[tp] = s
        text = memos[who].dumps("w", merge_maps(committed, added, settled))
        assert text == dumps_map(expected)


def _model(text: str | None) -> dict[tuple[str, int], OffsetSet]:
    """The map ``text`` holds, every partition parsed with one insert per range."""
    out: dict[tuple[str, int], OffsetSet] = {}
    for tp, s in loads_map(text).items():
        out[tp] = OffsetSet(floor=s.floor)
        for a, b in s.ranges:
            out[tp].add_range(a, b)
    return out


@given(_SPANS, st.integers(0, 40), st.integers(0, 200))
def test_raising_the_floor_keeps_exactly_the_offsets_above_it(
    spans: list[tuple[int, int]], floor: int, to: int
) -> None:
    s = OffsetSet(floor=floor)
    for a, n in spans:
        s.add_range(a, a + n)
    before = {o for o in range(220) if o in s}
    s.raise_floor(to)
    assert {o for o in range(220) if o in s} == before | set(range(to))
    assert all(a >= s.floor for a, _ in s.ranges) and (not s.ranges or s.ranges[0][0] > s.floor)


def test_the_memo_forgets_the_least_recently_used_branches_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = MapMemo(max_branches=2, max_partitions=2)
    texts = {b: memo.dumps(b, {("t", 0): OffsetSet(n)}) for n, b in enumerate(("a", "b", "c"), start=1)}
    parsed = _count_parses(monkeypatch)
    for b in ("a", "b", "c"):
        assert memo.loads(b, texts[b]) == {("t", 0): OffsetSet(" abc".index(b))}
    assert parsed == [""]  # branch a's entry: forgotten
