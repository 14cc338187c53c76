"""Pure pieces of the sink: offset range sets, projection rules, replay selection, ref parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.events import ChangeEvent, ChangeType
from sinks import projection
from sinks.catalog import RefSpec
from sinks.committed_offsets import (
    OffsetSet,
    compact,
    dumps_map,
    format_ranges,
    loads_map,
    merge_maps,
    parse_tp,
    tp_name,
)
from sinks.committer import Batch, Source, _select
from sinks.projection import Stored
from tests.factories import change_event

T = "onto.changes.objects"


def ev(eid: str, pk: str, change: str, version: int, typ: str = "person", **after: object) -> ChangeEvent:
    return change_event(
        eid,
        pk=pk,
        change=change,
        version=version,
        entity_type=typ,
        after=dict(after) if change not in ("DELETE", "TRUNCATE") else None,
        source="",
    )


# --- offsets ---------------------------------------------------------------------------------------


def test_compact_and_format_keep_gaps() -> None:
    assert compact([5, 3, 4, 4, 10, 12, 11, 20]) == [(3, 5), (10, 12), (20, 20)]
    assert format_ranges(range(100, 181)) + "," + format_ranges(range(182, 201)) == "100-180,182-200"
    assert format_ranges([100, 101, 102, 105]) == "100-102,105"
    assert format_ranges([]) == ""


def test_offset_set_parse_format_roundtrip_and_membership() -> None:
    s = OffsetSet.parse("100-180,182-200")
    assert s.format() == "100-180,182-200"
    assert 100 in s and 180 in s and 182 in s and 200 in s
    assert 181 not in s and 99 not in s and 201 not in s
    assert OffsetSet.parse("7").ranges == [(7, 7)]
    with pytest.raises(ValueError):
        OffsetSet.parse("9-3")


def test_a_parked_offset_is_not_covered_by_later_commits() -> None:
    """The trap from the brief: 850 waits while 851..900 commit; 850 must stay uncommitted."""
    s = OffsetSet(floor=800)
    s.add_range(800, 849)
    s.add_range(851, 900)
    assert 850 not in s
    assert s.floor == 850 and s.format() == "851-900"
    s.add(850)  # the parked event commits later
    assert s.floor == 901 and s.ranges == []


def test_adding_merges_touching_and_overlapping_ranges() -> None:
    s = OffsetSet.parse("10-20,30-40")
    s.add_range(21, 29)
    assert s.format() == "10-40"
    s.add_range(35, 50)
    assert s.format() == "10-50"
    s.add_range(5, 8)
    assert s.format() == "5-8,10-50"


def test_floor_absorbs_prefix_and_drops_detail_below() -> None:
    s = OffsetSet.parse("0-9,15-20")
    assert s.floor == 10 and s.format() == "15-20"
    s.raise_floor(17)
    assert s.floor == 21 and s.ranges == []
    assert 3 in s and 16 in s and 21 not in s
    s.raise_floor(5)  # never lowers
    assert s.floor == 21


def test_merge_maps_union_and_settled_floor() -> None:
    base = {(T, 0): OffsetSet.parse("100-110", floor=50)}
    added = {(T, 0): OffsetSet.parse("112-115"), (T, 1): OffsetSet.parse("3")}
    merged = merge_maps(base, added, settled={(T, 0): 111})
    assert str(merged[(T, 0)].format()) == "112-115" and merged[(T, 0)].floor == 111
    assert merged[(T, 1)].format() == "3"
    assert base[(T, 0)].format() == "100-110"  # inputs untouched
    assert loads_map(dumps_map(merged)) == merged
    assert parse_tp(tp_name((T, 3))) == (T, 3)


# --- projection rules ----------------------------------------------------------------------------


def test_create_then_update_in_one_batch_keeps_the_last() -> None:
    p = projection.plan([ev("a", "p1", "CREATE", 1, n=1), ev("b", "p1", "UPDATE", 2, n=2)], {})
    assert p.rows[("person", "p1")].event_id == "b" and not p.remove and not p.stale


def test_update_with_version_not_above_stored_is_ignored() -> None:
    stored = {("person", "p1"): Stored(5)}
    p = projection.plan([ev("a", "p1", "UPDATE", 5), ev("b", "p1", "UPDATE", 3)], stored)
    assert not p.changed and [e.event_id for e in p.stale] == ["a", "b"]


def test_newer_update_replaces_the_stored_row() -> None:
    p = projection.plan([ev("a", "p1", "UPDATE", 6)], {("person", "p1"): Stored(5)})
    assert ("person", "p1") in p.rows and p.remove == {("person", "p1")}


def test_delete_leaves_a_tombstone_that_blocks_older_updates() -> None:
    p = projection.plan([ev("d", "p1", "DELETE", 7), ev("u", "p1", "UPDATE", 6)], {("person", "p1"): Stored(5)})
    assert p.rows[("person", "p1")].change_type is ChangeType.DELETE
    assert [e.event_id for e in p.stale] == ["u"]
    later = projection.plan([ev("u", "p1", "UPDATE", 6)], {("person", "p1"): Stored(7, deleted=True)})
    assert not later.changed


def test_truncate_removes_every_row_of_the_type_only() -> None:
    stored = {("person", "p1"): Stored(3), ("person", "p2"): Stored(9, True), ("org", "o1"): Stored(1)}
    events = [ev("c", "p3", "CREATE", 1), ev("t", "*", "TRUNCATE", 0), ev("c2", "p1", "CREATE", 1)]
    p = projection.plan(events, stored)
    assert p.truncated == {"person"}
    assert p.remove == {("person", "p1"), ("person", "p2")}
    assert set(p.rows) == {("person", "p1")}  # p3 was created before the truncate: gone too
    assert ("org", "o1") not in p.remove


def test_snapshot_is_an_upsert_and_redelivery_is_a_no_op() -> None:
    first = projection.plan([ev("s", "p1", "SNAPSHOT", 4)], {})
    assert ("person", "p1") in first.rows
    again = projection.plan([ev("s", "p1", "SNAPSHOT", 4)], {("person", "p1"): Stored(4)})
    assert not again.changed


def test_touched_and_dedupe() -> None:
    events = [ev("a", "p1", "CREATE", 1), ev("a", "p1", "CREATE", 1), ev("t", "*", "TRUNCATE", 0, typ="org")]
    assert [e.event_id for e in projection.dedupe(events)] == ["a", "t"]
    assert projection.touched(events) == ({("person", "p1")}, {"org"})


# --- replay selection ----------------------------------------------------------------------------


def test_select_drops_committed_offsets_and_repeated_ids() -> None:
    items = [
        (ev("a", "p1", "CREATE", 1), Source(T, 0, 10)),
        (ev("b", "p2", "CREATE", 1), Source(T, 0, 11)),
        (ev("b", "p2", "CREATE", 1), Source(T, 0, 12)),  # producer retry: same id, new offset
        (ev("c", "p3", "CREATE", 1), Source(T, 1, 10)),
    ]
    batch = Batch.from_sources("w1", "b1", items)
    assert batch.offsets[(T, 0)].format() == "10-12"
    chosen = _select(batch, {(T, 0): OffsetSet.parse("10")})
    assert [e.event_id for e, _ in chosen] == ["b", "c"]


def test_select_looks_up_each_partitions_committed_offsets_once_not_per_event() -> None:
    # The branch's committed map is a Python mapping (a membership test and a __getitem__ per
    # lookup) and a commit's events come from a few partitions. Failed before: 200 lookups for
    # 120 events (2 per event of a committed partition, 1 per event of another).
    from collections.abc import Iterator, Mapping

    class Counted(Mapping[tuple[str, int], OffsetSet]):
        def __init__(self, sets: dict[tuple[str, int], OffsetSet]) -> None:
            self.sets, self.asked = sets, 0

        def __getitem__(self, tp: tuple[str, int]) -> OffsetSet:
            self.asked += 1
            return self.sets[tp]

        def __contains__(self, tp: object) -> bool:
            self.asked += 1
            return tp in self.sets

        def __iter__(self) -> Iterator[tuple[str, int]]:
            return iter(self.sets)

        def __len__(self) -> int:
            return len(self.sets)

    items = [(ev(f"e{i}", f"p{i}", "CREATE", 1), Source(T, i % 3, 100 + i)) for i in range(120)]
    committed = Counted({(T, 0): OffsetSet.parse("0-149"), (T, 1): OffsetSet.parse("100-130")})
    chosen = _select(Batch.from_sources("w1", "b1", items), committed)
    assert committed.asked <= 5  # two committed partitions (in + get), one absent (in)
    left = {e.event_id for e, _ in chosen}
    committed_offsets = {0: range(150), 1: range(100, 131), 2: range(0)}
    assert left == {f"e{i}" for i in range(120) if 100 + i not in committed_offsets[i % 3]}


# --- references ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "hash_", "ts"),
    [
        ("main", "main", None, None),
        ("world-a@0123abcd0123abcd", "world-a", "0123abcd0123abcd", None),
        ("main@*1700000000000", "main", None, 1700000000000),
        ("main*2023-11-14T22:13:20Z", "main", None, 1700000000000),
    ],
)
def test_ref_spec_parse(text: str, name: str, hash_: str | None, ts: int | None) -> None:
    spec = RefSpec.parse(text)
    assert (spec.name, spec.hash, spec.timestamp_ms) == (name, hash_, ts)
    assert spec.pinned is (hash_ is not None or ts is not None)


@pytest.mark.parametrize("bad", ["", "../x", "main@zz", "1main"])
def test_ref_spec_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        RefSpec.parse(bad)


def test_unchanged_properties_carry_over_within_a_batch() -> None:
    from dataclasses import replace

    from sinks import projection

    def ev(n: int, change: str, version: int, after: dict, unchanged: tuple[str, ...] = ()) -> ChangeEvent:
        return change_event(
            f"e{n}", world="w", pk="k", change=change, version=version, after=after, source="", unchanged=unchanged
        )

    p = projection.plan([ev(1, "CREATE", 1, {"a": 1, "big": "x"}), ev(2, "UPDATE", 2, {"a": 2}, ("big", "z"))], {})
    row = p.rows[("T", "k")]
    assert row.after == {"a": 2, "big": "x"} and row.unchanged == ("z",)
    assert projection.needs_stored_properties(p) == {("T", "k")}
    alone = projection.plan([ev(3, "UPDATE", 5, {"a": 9}, ("big",))], {("T", "k"): projection.Stored(4)})
    assert projection.needs_stored_properties(alone) == {("T", "k")}
    assert projection.carry_unchanged(alone.rows[("T", "k")], {"big": "y"}).after == {"big": "y", "a": 9}
    assert replace(row, unchanged=()).unchanged == ()


def test_truncate_then_toast_unchanged_update_in_one_batch_does_not_copy_pre_truncate_values() -> None:
    from dataclasses import replace

    from sinks import projection

    update = replace(ev("u", "k", "UPDATE", 5, typ="T", a=1), unchanged=("big",))
    p = projection.plan([ev("t", "*", "TRUNCATE", 0, typ="T"), update], {("T", "k"): projection.Stored(4)})
    assert ("T", "k") in p.rows and ("T", "k") in p.remove
    assert projection.needs_stored_properties(p) == set()  # the stored row was truncated away


def test_a_table_whose_metadata_file_is_gone_is_unreadable_not_an_os_error(tmp_path: Path) -> None:
    """The branch points at a deleted metadata JSON: TableUnreadable with the path (never retried
    as an outage). Before: pyiceberg's FileNotFoundError, an OSError the applier retried forever."""
    from sinks.catalog import NessieCatalog
    from sinks.errors import TableUnreadable
    from sinks.nessie import IcebergTable

    gone = f"file://{tmp_path}/onto/entity_events/metadata/00001.metadata.json"

    class Contents:
        def get_contents(self, ref: str, keys: list[tuple[str, ...]]) -> dict[tuple[str, ...], IcebergTable]:
            return {k: IcebergTable(gone, id="c1") for k in keys}

    cat = NessieCatalog(client=Contents(), ref="world-broken", warehouse=f"file://{tmp_path}")  # type: ignore[arg-type]
    with pytest.raises(TableUnreadable) as err:
        cat.load_table(("onto", "entity_events"))
    assert err.value.path == gone and not isinstance(err.value, OSError)


def test_applied_events_of_a_log_whose_manifest_list_is_gone_raise_table_unreadable(tmp_path: Path) -> None:
    """The applier's cause lookup on a broken branch: TableUnreadable with the path, never
    pyiceberg's FileNotFoundError (an OSError). Before: the raw error escaped the committer."""
    from sinks.committer import BatchCommitter
    from sinks.errors import TableUnreadable
    from streams.settings import Settings
    from tests.missing_files import missing_manifest_list

    broken = missing_manifest_list(tmp_path)
    committer = BatchCommitter(Settings(warehouse=broken.warehouse), client=broken)  # type: ignore[arg-type]
    with pytest.raises(TableUnreadable) as err:
        committer.applied_events("broken", {"e1"})
    assert broken.manifest_list.removeprefix("file://") in err.value.path
    assert not isinstance(err.value, OSError)
