"""The audit fold: order, commits and cause chains (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from worlds.audit import cause_chain, fold, missing_causes

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def row(event_id: str, version: int, batch: str, minute: int, caused_by: str | None = None, **kw: object) -> dict:
    return {
        "event_id": event_id,
        "change_type": kw.get("change", "UPDATE"),
        "version": version,
        "before_properties": None,
        "after_properties": '{"n":' + str(version) + "}",
        "caused_by": caused_by,
        "occurred_at": T0,
        "committed_at": T0 + timedelta(minutes=minute),
        "batch_id": batch,
        "source": "s",
        "applied": kw.get("applied", True),
    }


def test_fold_orders_by_commit_then_log_order_and_attaches_commits_and_causes() -> None:
    rows = [row("e3", 3, "b2", 2, caused_by="x1"), row("e1", 1, "b1", 1), row("e2", 2, "b1", 1)]
    causes = {"x1": "x0", "x0": None}
    out = fold(rows, causes, {"b1": "h1", "b2": "h2"})
    assert [e.event_id for e in out] == ["e1", "e2", "e3"]
    assert [e.commit_hash for e in out] == ["h1", "h1", "h2"]
    assert out[2].caused_by == ("x1", "x0") and out[0].caused_by == ()
    assert out[0].after == {"n": 1}
    # Inside a batch the log's order wins over versions: a late stale version stays last.
    late = fold([row("d", 3, "b", 1, change="DELETE"), row("s", 1, "b", 1, applied=False)], {}, {})
    assert [(e.version, e.applied) for e in late] == [(3, True), (1, False)]


def test_cause_chain_stops_on_loops_and_depth() -> None:
    assert cause_chain("a", {"a": "b", "b": "a"}) == ("b", "a")
    assert len(cause_chain("e0", {f"e{i}": f"e{i + 1}" for i in range(100)}, max_depth=5)) == 5
    assert missing_causes({"a": "b", "b": None, "c": "d"}) == {"d"}


def test_inside_a_batch_batch_seq_orders_rows_that_the_layout_sorted_by_entity() -> None:
    # The table layout sorts a flush's log rows by (type, pk, version), so the stale v1 that arrived
    # after the v3 delete lies first in the file; batch_seq keeps the order the world took them in.
    stale = {**row("s", 1, "b", 1, applied=False), "batch_seq": 2}
    delete = {**row("d", 3, "b", 1, change="DELETE"), "batch_seq": 1}
    out = fold([stale, delete], {}, {})
    assert [(e.version, e.applied) for e in out] == [(3, True), (1, False)]
