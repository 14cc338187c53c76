"""Rules of docs/architecture.md that import-linter cannot check: who commits, and the package map."""

from __future__ import annotations

import ast
import re
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


#: The packages of the map, in the order of its rows.
PACKAGES = ("models", "agents", "cdc", "ops", "sinks", "streams", "monitoring", "worlds", "api", "cli", "bench")


def package_map(doc: str) -> dict[str, str]:
    """Each package's text in docs/architecture.md's package map (its row, and for agents its table)."""
    section = doc[doc.index("## Package map") : doc.index("## Import rules")]
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `(\w+)/` \|(.*)$", section, re.M)}
    rows["agents"] += "".join(re.findall(r"^\| `agents/.*$", section, re.M))
    return rows


def modules(package: str) -> list[Path]:
    return sorted(p.relative_to(ROOT / package) for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py")


def test_the_package_map_names_every_module_and_only_modules_that_exist() -> None:
    rows = package_map((ROOT / "docs" / "architecture.md").read_text())
    assert set(rows) - {"scripts"} == set(PACKAGES)  # scripts/ holds shell scripts, no modules
    unnamed, stale = [], []
    for package in PACKAGES:
        row = rows[package]
        # `agents/cdc.py` in the cdc row points at another package's module: not one of cdc's.
        named = {
            name
            for folders, name in re.findall(r"`((?:\w+/)*)(\w+\.py)`", row)
            if folders.split("/")[0] in ("", package) or folders.split("/")[0] not in PACKAGES
        }
        for module in modules(package):
            # ops/replay/run.py: the row names the subpackage (`replay/`) and the module (`run.py`).
            folders_named = all(f"`{d}/`" in row or f"{d}/" in row for d in module.parts[:-1])
            if module.name not in named or not folders_named:
                unnamed.append(f"{package}/{module}")
        existing = {m.name for m in modules(package)}
        stale += [f"{package}/{n}" for n in sorted(named - existing)]
    assert unnamed == [], "modules docs/architecture.md's package map does not name (add them to the package's row)"
    assert stale == [], "modules the package map names that do not exist"
