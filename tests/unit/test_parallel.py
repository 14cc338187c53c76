"""tests/parallel.py: which tests share a process in a parallel run."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.parallel import EXCLUSIVE, EXCLUSIVE_UNIT, SHARED, exclusive_may_start, group_of, next_unit

ROOT = Path(__file__).resolve().parents[2]


def test_every_shared_entry_names_a_test_file_or_a_test_in_it() -> None:
    """A renamed file or test must not silently leave its group (and collide with another process)."""
    for key in SHARED:
        path, _, name = key.partition("::")
        source = ROOT / path
        assert source.is_file(), f"tests/parallel.py names {path}, which does not exist"
        if name:
            tests = {
                n.name
                for n in ast.walk(ast.parse(source.read_text()))
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            assert name in tests, f"tests/parallel.py names {key}, which does not exist"


def test_a_whole_file_entry_groups_each_of_its_tests_and_parameters() -> None:
    a = group_of("tests/integration/test_security_live.py::test_doctor_names_a_wrong_credential_in_one_line[kafka-x]")
    b = group_of("tests/integration/test_security_live.py::test_reconcile_dry_run_over_the_secured_stack")
    assert a == b == "group:secured-stack"


def test_a_single_test_entry_groups_that_test_only() -> None:
    ports = group_of("tests/integration/test_smoke.py::test_prometheus_scrapes_a_target_and_answers")
    assert ports == group_of(
        "tests/integration/test_metrics_live.py::test_consumer_lag_matches_kafka_consumer_group_command"
    )
    other = "tests/integration/test_smoke.py::test_redis_set_with_ttl"
    assert group_of(other) == other


def test_any_other_test_is_its_own_unit() -> None:
    nodeid = "tests/unit/test_causal.py::test_release_order[3]"
    assert group_of(nodeid) == nodeid


def test_exclusive_tests_form_one_unit_apart_from_the_shared_groups() -> None:
    gc = group_of("tests/integration/test_world_gc.py::test_gc_cli")
    assert gc == EXCLUSIVE_UNIT == group_of("tests/integration/test_world_gc.py::test_gc_on_an_s3_warehouse[x]")


def test_the_exclusive_unit_waits_until_it_is_last_and_no_other_process_has_work() -> None:
    queued = [EXCLUSIVE_UNIT, "tests/unit/test_a.py::test_1", "group:secured-stack"]
    assert next_unit(queued) == "tests/unit/test_a.py::test_1"
    assert next_unit([EXCLUSIVE_UNIT]) is None
    assert not exclusive_may_start(queued, [0, 0])
    assert not exclusive_may_start([EXCLUSIVE_UNIT], [0, 1])  # another process still holds a test
    assert exclusive_may_start([EXCLUSIVE_UNIT], [0, 0])
    assert exclusive_may_start([EXCLUSIVE_UNIT], [])
    assert not exclusive_may_start([], [])


def test_every_exclusive_entry_names_a_test_file_or_a_test_in_it() -> None:
    for key in EXCLUSIVE:
        path, _, name = key.partition("::")
        assert (ROOT / path).is_file(), f"tests/parallel.py names {path}, which does not exist"
        if name:
            assert f"def {name}(" in (ROOT / path).read_text(), f"tests/parallel.py names {key}, which does not exist"
    ctrl_c = "tests/integration/test_ops.py::test_ctrl_c_saves_the_checkpoint_and_the_summary_counts_that_run"
    assert group_of(ctrl_c) == EXCLUSIVE_UNIT
    assert group_of("tests/integration/test_ops.py::test_rebuild_equals_the_live_projections") != EXCLUSIVE_UNIT
