"""The pure CDC modules do no I/O: only ``cdc/mapping_loader.py`` reads a file, nothing in ``cdc/`` reads the env."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = ("cdc/debezium.py", "cdc/mapping.py", "cdc/convert.py", "cdc/plan.py")
IO_MODULES = {"os", "pathlib", "io", "socket", "yaml", "aiokafka", "redis", "httpx", "pyiceberg", "subprocess"}


def io_uses(source: str) -> list[str]:
    """I/O modules a module imports, and the builtins ``open`` / ``input`` it calls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in IO_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in IO_MODULES:
            found.append(node.module)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("open", "input"):
            found.append(f"{node.func.id}()")
    return found


@pytest.mark.parametrize("path", PURE)
def test_pure_cdc_modules_do_no_io(path: str) -> None:
    assert io_uses((ROOT / path).read_text()) == [], f"{path} does I/O: keep it in cdc/mapping_loader.py or agents/"


def test_no_cdc_module_reads_the_environment() -> None:
    for path in sorted((ROOT / "cdc").glob("*.py")):
        text = path.read_text()
        assert "environ" not in text and "getenv" not in text, f"{path.name}: settings come from streams/settings.py"


def test_the_check_sees_a_file_read_and_an_env_read() -> None:
    assert io_uses("import os\nfrom pathlib import Path\nimport yaml\nopen('x')\n") == [
        "os",
        "pathlib",
        "yaml",
        "open()",
    ]
