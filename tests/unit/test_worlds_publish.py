"""The WAP gate's pure core: plan ids, checks, verdicts, records, the publish decision, state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from worlds.publish import (
    Action,
    AuditRecord,
    Check,
    Heads,
    Observed,
    PublishError,
    Thresholds,
    Verdict,
    audit,
    decide,
    fold_state,
    plan_id,
    plan_status,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
FF = Heads("etl", "prod", "s" * 64, "b" * 64, "b" * 64)  # target still at the base
DIV = Heads("etl", "prod", "s" * 64, "t" * 64, "b" * 64)
CHANGED = Observed(drift=0, tables_updated=("onto.entity_common",), entities={"added": 2, "modified": 1})


def test_plan_id_is_stable_and_depends_on_heads_and_thresholds() -> None:
    assert plan_id(FF, Thresholds()) == plan_id(Heads(*vars(FF).values()), Thresholds())
    assert plan_id(FF, Thresholds()) != plan_id(DIV, Thresholds())
    assert plan_id(FF, Thresholds()) != plan_id(FF, Thresholds(max_drift=3))
    assert plan_id(FF, Thresholds()).startswith("pl-")


def test_eligible_when_every_check_passes() -> None:
    r = audit(FF, CHANGED, Thresholds(), "ana", T0)
    assert r.verdict is Verdict.ELIGIBLE and r.blocked_by == [] and r.fast_forward


@pytest.mark.parametrize(
    ("obs", "t", "blocked"),
    [
        (Observed(drift=11, tables_updated=("a",)), Thresholds(max_drift=10), ["drift"]),
        (Observed(drift=0, tables_added=("a", "b", "c")), Thresholds(max_tables=2), ["tables"]),
        (
            Observed(drift=0, tables_added=("a",), entities={"added": 6}),
            Thresholds(max_changed_entities=5),
            ["entities"],
        ),
        (Observed(drift=0, tables_added=("a",), conflicts=({"type": "MODIFY_MODIFY"},)), Thresholds(), ["conflicts"]),
        (Observed(drift=99, tables_added=("a", "b")), Thresholds(max_drift=1, max_tables=1), ["drift", "tables"]),
    ],
)
def test_blocked_names_every_failing_check(obs: Observed, t: Thresholds, blocked: list[str]) -> None:
    r = audit(DIV, obs, t, "ana", T0)
    assert r.verdict is Verdict.BLOCKED and r.blocked_by == blocked


def test_drift_at_the_limit_passes() -> None:
    r = audit(DIV, Observed(drift=10, tables_added=("a",)), Thresholds(max_drift=10), "ana", T0)
    assert r.verdict is Verdict.ELIGIBLE
    assert next(c for c in r.checks if c.check is Check.DRIFT).value == 10


def test_up_to_date_when_source_is_an_ancestor_or_changed_nothing() -> None:
    assert (
        audit(Heads("e", "prod", "b" * 64, "t" * 64, "b" * 64), CHANGED, Thresholds(), "x", T0).verdict
        is Verdict.UP_TO_DATE
    )
    assert audit(FF, Observed(drift=50), Thresholds(), "x", T0).verdict is Verdict.UP_TO_DATE


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(PublishError, match="differ"):
        audit(Heads("a", "a", "1", "2", "3"), CHANGED, Thresholds(), "x", T0)
    with pytest.raises(PublishError, match="max-tables"):
        audit(FF, CHANGED, Thresholds(max_tables=0), "x", T0)


def test_record_round_trips_through_json() -> None:
    r = audit(DIV, Observed(drift=3, tables_removed=("x",), conflicts=({"pk": "1"},)), Thresholds(), "ana", T0)
    back = AuditRecord.from_json(r.to_json())
    assert back == r and back.to_json() == r.to_json()


def _decide(r: AuditRecord, **kw: object) -> Action:
    args = {
        "approved": True,
        "outcome": None,
        "source_hash": r.heads.source_hash,
        "target_hash": r.heads.target_hash,
        "landed": False,
    }
    args.update(kw)
    return decide(r, **args).action  # type: ignore[arg-type]


def test_decision_paths() -> None:
    ff = audit(FF, CHANGED, Thresholds(), "a", T0)
    div = audit(DIV, CHANGED, Thresholds(), "a", T0)
    assert _decide(ff) is Action.FAST_FORWARD
    assert _decide(div) is Action.MERGE
    assert _decide(ff, approved=False) is Action.REFUSE
    assert _decide(ff, outcome="published") is Action.DONE
    assert _decide(ff, landed=True, source_hash=None) is Action.COMPLETE
    blocked = audit(DIV, Observed(drift=20, tables_added=("a",)), Thresholds(), "a", T0)
    assert (
        "blocked by drift"
        in decide(
            blocked, approved=True, outcome=None, source_hash=DIV.source_hash, target_hash=DIV.target_hash, landed=False
        ).reason
    )


@pytest.mark.parametrize("moved", ["source_hash", "target_hash"])
def test_a_moved_head_refuses_with_reaudit(moved: str) -> None:
    r = audit(FF, CHANGED, Thresholds(), "a", T0)
    d = decide(
        r,
        approved=True,
        outcome=None,
        landed=False,
        **{"source_hash": FF.source_hash, "target_hash": FF.target_hash, moved: "f" * 64},
    )
    assert d.action is Action.REFUSE and d.reason.endswith("re-audit")


def _entries() -> list[dict[str, object]]:
    r1 = audit(DIV, Observed(drift=20, tables_added=("a",)), Thresholds(), "a", T0).to_json()
    r2 = audit(FF, CHANGED, Thresholds(), "a", T0 + timedelta(hours=1)).to_json()
    return [
        {"kind": "audit", "record": r1, "source_changed": T0.isoformat()},
        {"kind": "audit", "record": r2, "source_changed": T0.isoformat()},
        {"kind": "approve", "plan_id": r2["plan_id"], "by": "bo"},
        {"kind": "run", "plan_id": r2["plan_id"], "outcome": "published", "commit": "c1"},
        {"kind": "run", "plan_id": r2["plan_id"], "outcome": "published", "commit": "c2"},
    ]


def test_state_keeps_first_seen_and_last_verdict_and_staleness() -> None:
    st = fold_state(_entries())["etl"]
    assert st.first_seen == T0 and st.last_audit == T0 + timedelta(hours=1)
    assert st.last_verdict == "eligible" and st.outcome == "published"
    assert st.staleness_seconds(T0 + timedelta(days=1)) == 86400


def test_plan_status_reports_the_first_published_run() -> None:
    e = _entries()
    pid = e[1]["record"]["plan_id"]  # type: ignore[index]
    record, by, outcome, published = plan_status(e, pid)
    assert record is not None and by == "bo" and outcome == "published" and published["commit"] == "c1"  # type: ignore[index]
    assert plan_status(e, "pl-none")[0] is None


def test_exit_codes_name_the_first_failing_check() -> None:
    from worlds.publish import exit_code

    assert exit_code(audit(FF, CHANGED, Thresholds(), "a", T0)) == 0
    assert exit_code(audit(FF, Observed(drift=0), Thresholds(), "a", T0)) == 3
    t = Thresholds(max_tables=1)
    assert exit_code(audit(DIV, Observed(drift=0, tables_added=("a", "b")), t, "a", T0)) == 11
    assert exit_code(audit(DIV, Observed(drift=30, tables_added=("a", "b")), t, "a", T0)) == 10


def test_a_landed_state_never_completes_a_plan_that_could_not_publish() -> None:
    """An up-to-date (or unapproved) plan whose source hash is on the target was never published by the
    gate: `run` must refuse rather than 'complete' it (which would delete the source branch)."""
    same = Heads("etl", "prod", "b" * 64, "t" * 64, "b" * 64)
    up = audit(same, CHANGED, Thresholds(), "a", T0)
    assert _decide(up, landed=True, approved=False) is Action.REFUSE
    ff = audit(FF, CHANGED, Thresholds(), "a", T0)
    assert _decide(ff, landed=True, approved=False) is Action.REFUSE
    assert _decide(ff, landed=True) is Action.COMPLETE
