"""Rollback planning (pure): table actions, the rolled-back range, the restored metadata."""

from __future__ import annotations

from worlds.rollback import CREATE, DROP, KEEP, RESTORE, RollbackPlan, plan_actions, restored_metadata, rolled_range


def test_plan_actions() -> None:
    acts = plan_actions(["e", "c", "x", "n"], {"e": "t1", "c": "same", "n": "t3"}, {"e": "h1", "c": "same", "x": "h2"})
    assert [(a.table, a.action) for a in acts] == [("e", RESTORE), ("c", KEEP), ("x", DROP), ("n", CREATE)]


def test_rolled_range_stops_at_target_and_refuses_strangers() -> None:
    hist = [("h3", {"causeway.batch_id": "b3"}), ("h2", {}), ("h1", {"causeway.batch_id": "b1"}), ("h0", {})]
    assert rolled_range(hist, "h1") == (("h3", "h2"), ("b3",))
    assert rolled_range(hist, "h3") == ((), ())
    assert rolled_range(hist, "zz") is None


def test_restored_metadata_keeps_offsets_and_never_rewinds_sequence() -> None:
    target = {
        "location": "file:///t",
        "last-sequence-number": 3,
        "last-updated-ms": 10,
        "properties": {"causeway.committed-offsets": "OLD", "x": "target"},
        "metadata-log": [{"timestamp-ms": 1, "metadata-file": "m1"}],
        "current-snapshot-id": 7,
    }
    head = {
        "last-sequence-number": 9,
        "last-updated-ms": 50,
        "properties": {"causeway.committed-offsets": "NEW", "x": "head"},
        "metadata-log": [{"timestamp-ms": i, "metadata-file": f"m{i}"} for i in range(25)],
    }
    out = restored_metadata(target, head, "m-head", now_ms=100)
    assert out["properties"] == {"causeway.committed-offsets": "NEW", "x": "target"}
    assert out["last-sequence-number"] == 9 and out["last-updated-ms"] == 100
    assert out["metadata-log"][-1] == {"timestamp-ms": 50, "metadata-file": "m-head"} and len(out["metadata-log"]) == 20
    assert out["current-snapshot-id"] == 7 and target["properties"]["causeway.committed-offsets"] == "OLD"


def test_plan_properties_record_the_range() -> None:
    plan = RollbackPlan("w", "world-w", "H" * 64, "T" * 64, (), ("h2", "h1"), tuple(f"b{i}" for i in range(300)))
    props = plan.properties()
    assert props["causeway.rollback.to"] == "T" * 64 and props["causeway.rollback.from"] == "H" * 64
    assert props["causeway.rollback.commits"] == "2" and props["causeway.rollback.batches"].endswith(",...")
    assert plan.noop and "rollback world w" in plan.message()
