"""Reconciliation's pure decisions: contents, scope, and the CLI's verdict and exit codes."""

from __future__ import annotations

import orjson
import pytest

from agents.reconcile_plan import (
    EXIT_CONSISTENT,
    EXIT_FAILED,
    EXIT_UNREPAIRABLE,
    EXIT_WOULD_REPAIR,
    Row,
    RunReport,
    ScopeError,
    TypeReport,
    WorldScope,
    compare,
    contents_agree,
    derive,
    digest,
    expected,
    verdict,
)


def _log(pk: str, v: int, after: dict[str, object] | None, change_type: str = "UPDATE") -> dict[str, object]:
    props = None if after is None else orjson.dumps(after, option=orjson.OPT_SORT_KEYS).decode()
    return {"entity_type": "T", "entity_pk": pk, "change_type": change_type, "version": v, "event_id": f"{pk}{v}",
            "after_properties": props}  # fmt: skip


def test_a_row_with_the_right_writer_but_other_properties_is_drift() -> None:
    """Issue 19.4: only version, deleted flag and event id were compared."""
    want = expected(derive([_log("a", 1, {"n": 1}), _log("b", 1, {"n": 2})]))
    same = {k: Row(r.version, r.deleted, r.event_id, r.props) for k, r in want.items()}
    edited = dict(same)
    edited[("T", "b")] = Row(1, False, "b1", digest('{"n":999}'))
    reports, write, _ = compare(edited, want, {}, threshold=0)
    assert write == {("T", "b")} and reports["T"].mismatched == 1 and reports["T"].drift == 1
    _, write, _ = compare(same, want, {}, threshold=0)
    assert not write


def test_contents_agree_allows_carried_unchanged_properties_only() -> None:
    assert contents_agree('{"a":1}', '{"a":1}')
    assert contents_agree('{"a":1,"kept":2}', '{"a":1}')  # an unchanged property carried over
    assert not contents_agree('{"a":2,"kept":2}', '{"a":1}')
    assert not contents_agree('{"kept":2}', '{"a":1}')
    assert contents_agree(None, None) and not contents_agree(None, '{"a":1}')


def test_scope_selects_served_worlds_ids_and_patterns() -> None:
    """Issues 19.8 / 24.6: one rule for which worlds a pass covers."""
    branches = ["prod", "team-a-1", "team-a-2", "team-b-1", "x"]
    assert WorldScope.parse("served").select(branches, served={"x", "gone"}) == ["x"]
    assert WorldScope.parse("served").select(branches) == []
    assert WorldScope.parse("prod, team-a-*").select(branches, served={"x"}) == ["prod", "team-a-1", "team-a-2"]
    assert WorldScope.parse("served,team-b-*").select(branches, served={"prod"}) == ["prod", "team-b-1"]
    assert WorldScope.parse("*").select(branches) == sorted(branches)
    assert WorldScope.parse("served").empty_without_worker and not WorldScope.parse("prod").empty_without_worker
    with pytest.raises(ScopeError, match="Bad World"):
        WorldScope.parse("prod,Bad World")


def _report(world: str, *types: TypeReport, dry_run: bool = False, failed: bool = False) -> RunReport:
    r = RunReport(world, "failed" if failed else "ok", {t.object_type: t for t in types}, dry_run=dry_run)
    r.error = "NessieUnavailable: down" if failed else None
    return r


def test_verdict_tells_found_repaired_and_unrepairable_apart() -> None:
    """Issue 19.10: control-only drift exited 0 with "ok"."""
    clean = _report("a", TypeReport("T", 3, 3, 3, 0))
    assert verdict([clean], 0).exit_code == EXIT_CONSISTENT
    repaired = _report("b", TypeReport("T", 3, 2, 3, 1, repaired=1))
    v = verdict([clean, repaired], 0)
    assert v.exit_code == EXIT_CONSISTENT and v.repaired == {"b": 1} and v.consistent == ["a"]
    control_only = _report("c", TypeReport("T", 5, 3, 3, 0))
    v = verdict([clean, repaired, control_only], 0)
    assert v.exit_code == EXIT_UNREPAIRABLE
    text = dict(v.rows())
    assert (
        "c/T: control count 5, event log 3" in text["cannot repair"] and "rebuild cannot fix" in text["cannot repair"]
    )
    assert text["exit code"].startswith("5 ")
    dry = _report("d", TypeReport("T", None, 2, 3, 1, repaired=1), dry_run=True)
    assert verdict([dry], 0).exit_code == EXIT_WOULD_REPAIR
    assert verdict([dry, control_only, _report("e", failed=True)], 0).exit_code == EXIT_FAILED
    # Within the threshold: left alone, said so, and consistent.
    small = _report("f", TypeReport("T", 3, 2, 3, 1))
    v = verdict([small], 1)
    assert v.exit_code == EXIT_CONSISTENT and v.tolerated == {"f": 1} and "within threshold" in dict(v.rows())
