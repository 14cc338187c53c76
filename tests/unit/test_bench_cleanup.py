"""A benchmark run removes what it made, found by its unique id in every name, and nothing else."""

from __future__ import annotations

from pathlib import Path

from bench.cleanup import made_by, remove_warehouses


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
