"""Rules of docs/architecture.md that import-linter cannot check: who commits, and the package map."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Every package but sinks/ (the write path) and bench/ (the harness builds its own contenders).
NOT_THE_WRITE_PATH = ("models", "streams", "cdc", "monitoring", "worlds", "agents", "ops", "api", "cli")


def nessie_commits(source: str) -> list[int]:
    """Lines that call a Nessie client's ``commit(branch, hash, operations, message=...)``.

    Kafka's ``consumer.commit(offsets)`` and pyiceberg's ``commit_transaction()`` do not match: a
    Nessie commit names a branch, an expected hash and operations, or passes ``message=``.
    """
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "commit"
        and (len(node.args) >= 3 or any(k.arg == "message" for k in node.keywords))
    ]


def test_the_commit_rule_sees_a_nessie_commit_and_not_a_kafka_one() -> None:
    assert nessie_commits("client.commit(b, h, [op], message='m', author='a')\n") == [1]
    assert nessie_commits("self.client.commit(b, h, ops)\n") == [1]
    assert nessie_commits("await consumer.commit(offsets)\ntx.commit_transaction()\nw.commit(events)\n") == []


def test_nothing_outside_sinks_commits_to_nessie_itself() -> None:
    """Every writer goes through the write path's commit loop (``sinks/occ.py``); rule 5 of the doc."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in NOT_THE_WRITE_PATH
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in nessie_commits(path.read_text())
    ]
    assert found == [], "Nessie commits outside sinks/ (use sinks.occ.commit_operations or Occ.run)"
