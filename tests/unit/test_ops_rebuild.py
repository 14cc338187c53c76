"""Folding the event log into projections, and the diff (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ops.rebuild.plan import diff, fold
from ops.rebuild.run import rebuild_name, stale_rebuilds

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _row(n: int, pk: str, change: str, version: int, applied: bool = True, etype: str = "Sensor", kind: str = "object"):  # type: ignore[no-untyped-def]
    return {
        "event_id": f"e{n}",
        "kind": kind,
        "entity_type": etype,
        "entity_pk": pk,
        "change_type": change,
        "version": version,
        "after_properties": None if change == "DELETE" else f'{{"n":{n}}}',
        "from_pk": "a" if kind == "link" else None,
        "to_pk": "b" if kind == "link" else None,
        "occurred_at": T0,
        "committed_at": T0 + timedelta(seconds=n),
        "batch_id": f"b{n}",
        "schema_version": 1,
        "applied": applied,
    }


def test_highest_version_wins_delete_tombstones_and_stale_rows_are_ignored() -> None:
    rows = [
        _row(1, "p1", "CREATE", 1),
        _row(3, "p1", "UPDATE", 3),
        _row(2, "p1", "UPDATE", 2),  # listed out of order: fold sorts by commit time
        _row(4, "p1", "UPDATE", 9, applied=False),  # refused as stale when applied: not in the projection
        _row(5, "p2", "CREATE", 1),
        _row(6, "p2", "DELETE", 2),
        _row(7, "l1", "CREATE", 1, kind="link", etype="knows"),
    ]
    out = fold(rows)
    assert out.events_used == 6
    assert out.objects[("Sensor", "p1")]["version"] == 3
    assert out.objects[("Sensor", "p1")]["properties"] == '{"n":3}'
    assert out.objects[("Sensor", "p1")]["batch_id"] == "b3"
    tomb = out.objects[("Sensor", "p2")]
    assert tomb["deleted"] and tomb["properties"] is None and tomb["version"] == 2
    assert out.links[("knows", "l1")]["from_pk"] == "a"


def test_truncate_clears_earlier_rows_of_its_type_only() -> None:
    rows = [
        _row(1, "p1", "CREATE", 1),
        _row(2, "q1", "CREATE", 1, etype="Pump"),
        _row(3, "*", "TRUNCATE", 0),
        _row(4, "p9", "CREATE", 1),
    ]
    out = fold(rows)
    assert set(out.objects) == {("Pump", "q1"), ("Sensor", "p9")}


def test_diff() -> None:
    live: dict[tuple[str, str], dict[str, Any]] = {
        ("S", "a"): {"version": 1, "deleted": False, "properties": "{}", "event_id": "e1"},
        ("S", "b"): {"version": 1},
    }
    rebuilt: dict[tuple[str, str], dict[str, Any]] = {
        ("S", "a"): {"version": 2, "deleted": False, "properties": "{}", "event_id": "e2"},
        ("S", "c"): {"version": 1},
    }
    d = diff("entity_common", live, rebuilt)
    assert (d.changed, d.only_live, d.only_rebuilt, d.same) == ([("S", "a")], [("S", "b")], [("S", "c")], 0)
    assert d.sample() == ["- S/b", "+ S/c", "~ S/a"]
    assert diff("t", live, live).identical


def test_stale_rebuild_branches_are_those_of_other_heads_of_the_same_world() -> None:
    head = "ab" * 32
    names = [
        rebuild_name("w", head),  # this rebuild: kept
        rebuild_name("w", "cd" * 32),  # an older head: stale
        rebuild_name("w-2", "cd" * 32),  # another world whose id starts with "w-"
        "rebuild-w-notahash1234",
        "main",
    ]
    assert stale_rebuilds("w", head, names) == [rebuild_name("w", "cd" * 32)]
