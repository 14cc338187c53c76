"""A benchmark run removes what it made, found by its unique id in every name, and nothing else."""

from __future__ import annotations

from pathlib import Path

from bench.cleanup import keys_made_by, made_by, remove_warehouses


def test_a_runs_names_are_found_by_its_id_and_no_other_runs_or_the_projects() -> None:
    u = "0a1b2c3d"
    names = [
        f"bench-{u}-cw-main",  # causeway's main branch
        f"world-b{u}-1",  # a causeway world
        f"bench-{u}-cl-b{u}-2",  # a ceiling branch
        f"bench.{u}.causeway.objects",  # a topic
        f"bench.{u}.causeway.dlq",
        f"bench-{u}-causeway-faust-__assignor-__leader",  # the Faust app's own topic
        "bench-ffffffff-cw-main",  # another run's
        "world-bffffffff-1",
        "main",
        "world-prod",
        "onto.changes.objects",
        f"world-{u}",  # a user's world that happens to hold the same hex: not the run's shape
    ]
    assert made_by(names, u) == sorted(names[:6])


def test_warehouses_go_and_the_logs_stay(tmp_path: Path) -> None:
    for contender in ("causeway", "ceiling"):
        (tmp_path / contender / "warehouse" / "onto").mkdir(parents=True)
        (tmp_path / contender / "warehouse" / "onto" / "f.parquet").write_bytes(b"x")
    (tmp_path / "causeway-0.log").write_text("log")
    assert remove_warehouses(tmp_path) == 2
    assert not list(tmp_path.glob("*/warehouse")) and (tmp_path / "causeway-0.log").exists()


def test_a_runs_redis_keys_are_found_by_its_id_and_no_other_runs_or_the_projects() -> None:
    u = "0a1b2c3d"
    keys = [
        f"causeway:dead:{{bench.{u}.causeway.objects:0}}:882960",  # a dead-letter decision of its topic
        f"causeway:dead-id:{{b{u}-1}}:0:e1",  # a decision by event id, in one of its worlds
        f"causeway:marks:{{b{u}-2}}:5:s1f",  # a mark bucket of one of its worlds
        f"causeway:applied:b{u}-1:e7",  # the old mark format, no hash tag
        f"bench:{u}:processed:e9",  # the ceiling's
        "causeway:dead:{bench.ffffffff.causeway.objects:0}:1",  # another run's
        "causeway:marks:{bffffffff-1}:5:s1f",
        "causeway:marks:{prod}:5:s1f",  # shared by every run: goes with its window
        "causeway:dead:{onto.changes.objects:3}:17",  # the project's own
        f"causeway:marks:{{{u}}}:5:s1f",  # a user's world holding the same hex: not the run's shape
    ]
    assert keys_made_by(keys, u) == sorted(keys[:5])
