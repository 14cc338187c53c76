"""The event log's merge plan and merge (pure): bounded groups, sorted runs merged in order."""

from __future__ import annotations

import random

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.logcompact import (
    Candidate,
    choose,
    done_rows,
    is_sorted,
    lifts,
    merge_bound,
    merge_runs,
    pack,
    unmasked,
    within,
)
from sinks.rows import EVENTS_SORT

KEYS = [k for k, _ in EVENTS_SORT]


def log_rows(rows: list[tuple[str, str, int, int]], tag: str) -> pa.Table:
    """Rows of the log's sort columns, plus a column saying which input each row came from."""
    columns = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    return pa.table(
        {
            "entity_type": pa.array(columns[0], pa.string()),
            "entity_pk": pa.array(columns[1], pa.string()),
            "version": pa.array(columns[2], pa.int64()),
            "batch_seq": pa.array(columns[3], pa.int32()),
            "src": pa.array([tag] * len(rows), pa.string()),
        }
    )


def test_a_full_tier_is_packed_into_groups_that_never_exceed_the_bound() -> None:
    """Failed before: a tier was merged whole (here 8 files of 30 rows: one merge of 240 rows)."""
    tier_files = [Candidate(f"f{i}", (0, (19_000,)), 30 + i) for i in range(8)]
    merges = choose(tier_files, 1_000, base=1, max_size=100)
    sizes = {c.path: c.size for c in tier_files}
    assert merges and all(len(g) >= 2 and sum(sizes[p] for p in g) <= 100 for g in merges)
    assert sorted(p for g in merges for p in g) == sorted(sizes)[: sum(len(g) for g in merges)]
    assert len({p for g in merges for p in g}) == sum(len(g) for g in merges)  # no file in two merges
    assert choose(tier_files, 1_000, base=1) == [sorted(sizes)]  # unbounded: the whole tier, as before


def test_packing_drops_a_group_of_one_and_keeps_files_of_other_partitions_apart() -> None:
    files = [Candidate("a", (0, (1,)), 40), Candidate("b", (0, (1,)), 50), Candidate("c", (0, (1,)), 60)]
    assert [[c.path for c in g] for g in pack(files, 100)] == [["a", "b"]]  # "c" waits
    one = [Candidate(f"1-{i}", (0, (1,)), 10) for i in range(8)]
    two = [Candidate(f"2-{i}", (0, (2,)), 10) for i in range(8)]
    merges = choose(one + two, 1_000, fanout=8, base=1, max_size=60)
    assert len(merges) == 4 and all(len({p[0] for p in g}) == 1 for g in merges)  # never across partitions


def test_a_merge_takes_the_longest_prefix_that_fits_and_lifts_only_across_a_tier() -> None:
    """The step both small-file merges share: the log per merge, the projections per flush."""
    files = [Candidate(f"f{i}", (0, ()), size) for i, size in enumerate([30, 40, 50, 10])]
    assert [c.path for c in within(files, 120)] == ["f0", "f1", "f2"]
    assert [c.path for c in within(files, 119)] == ["f0", "f1"]  # a prefix: f3 would fit, but after f2
    assert within(files, 29) == []
    assert [g and [c.path for c in g] for g in pack(files, 60)] == [["f3", "f0"]]  # f1, f2 alone: dropped
    assert lifts([20, 20], base=1) is False  # 40 rows: tier 1 (8-63), as 20 is
    assert lifts([40, 40], base=1) is True  # 80 rows: tier 2
    assert lifts([100], base=1) is False  # one file merges nothing


def test_the_bound_is_the_rows_or_the_bytes_setting_and_files_are_done_at_half_of_it_or_of_a_target() -> None:
    assert merge_bound(512.0, 100_000, 64 * 2**20) == 100_000
    assert merge_bound(2048.0, 100_000, 64 * 2**20) == 32_768
    assert merge_bound(2048.0, 100_000, 1) == 2  # a merge still takes two files
    assert done_rows(64 * 2**20, 256.0, 100_000) == 50_000
    assert done_rows(192 * 1024, 512.0, 100_000) == 192  # a small target: done at half of it, as before


def test_files_a_delete_may_apply_to_are_not_merged() -> None:
    files = [Candidate("a", (0, (1,)), 1), Candidate("b", (0, (2,)), 1), Candidate("c", (1, (1,)), 1)]
    assert [f.path for f in unmasked(files, [Candidate("d", (0, (1,)), 1)])] == ["b", "c"]
    assert unmasked(files, [Candidate("d", (0, ()), 1)]) == []  # unpartitioned: may apply anywhere
    assert unmasked(files, []) == files


def test_disjoint_sorted_runs_are_concatenated_without_a_copy() -> None:
    low = log_rows([("person", f"p{i:03}", 1, i) for i in range(50)], "low")
    high = log_rows([("person", f"q{i:03}", 1, i) for i in range(50)], "high")
    merged = merge_runs([high, low], EVENTS_SORT)
    assert (
        merged.column("entity_pk").to_pylist()
        == low.column("entity_pk").to_pylist() + high.column("entity_pk").to_pylist()
    )
    buffers = {b.address for t in (low, high) for c in t.columns for ch in c.chunks for b in ch.buffers() if b}
    assert {b.address for c in merged.columns for ch in c.chunks for b in ch.buffers() if b} <= buffers


def test_an_unsorted_run_or_a_null_key_sorts_everything() -> None:
    unsorted = log_rows([("person", "b", 1, 0), ("person", "a", 1, 1)], "u")
    assert not is_sorted(unsorted, KEYS)
    assert merge_runs([unsorted], EVENTS_SORT).column("entity_pk").to_pylist() == ["a", "b"]
    with_null = log_rows([("person", "a", 1, 0), ("person", "b", 1, 1)], "n").set_column(
        3, "batch_seq", pa.array([None, 1], pa.int32())
    )
    assert not is_sorted(with_null, KEYS)
    assert is_sorted(log_rows([("person", "a", 2, 0), ("person", "a", 2, 0), ("x", "", 0, 0)], "s"), KEYS)


key_rows = st.lists(
    st.tuples(
        st.sampled_from(["link", "person", "place"]), st.text("abc", max_size=3), st.integers(0, 4), st.integers(0, 3)
    ),
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(key_rows, min_size=1, max_size=6), st.booleans(), st.randoms())
def test_merged_runs_hold_every_input_row_once_in_sort_order(
    runs: list[list[tuple[str, str, int, int]]], presorted: bool, rnd: random.Random
) -> None:
    """The merge equals the inputs' rows (none lost, none repeated) in the log's sort order."""
    parts = [log_rows(sorted(r) if presorted else rnd.sample(r, len(r)), f"r{i}") for i, r in enumerate(runs)]
    given_parts = list(parts)
    merged = merge_runs(given_parts, EVENTS_SORT)
    assert given_parts == []  # handed over: the caller keeps no input alive through the write
    expected = pa.concat_tables(parts).to_pylist()
    got = merged.to_pylist()
    key = lambda r: (r["entity_type"], r["entity_pk"], r["version"], r["batch_seq"])  # noqa: E731
    assert sorted(got, key=lambda r: (key(r), r["src"])) == sorted(expected, key=lambda r: (key(r), r["src"]))
    assert [key(r) for r in got] == sorted(key(r) for r in got)


def test_a_merges_transients_are_three_copies_of_its_rows_at_the_flushs_row_size() -> None:
    from types import SimpleNamespace

    from sinks.logcompact import merge_transient_bytes

    files = {
        "a": SimpleNamespace(record_count=1_000, file_size_in_bytes=20_000),
        "b": SimpleNamespace(record_count=3_000, file_size_in_bytes=50_000),
        "c": SimpleNamespace(record_count=9_999, file_size_in_bytes=1),
    }
    assert merge_transient_bytes(files, ["a", "b"], 250.0) == 3 * 4_000 * 250
    assert merge_transient_bytes(files, ["a", "b"], None) == 3 * 70_000  # no row size: the files' bytes
