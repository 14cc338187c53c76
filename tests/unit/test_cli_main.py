"""Every command module of cli/ is registered on `causeway`, and every command answers --help."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
GROUPS = (
    "api-token", "config", "demo", "dlq", "doctor", "gc", "offsets", "publish", "rebuild",
    "reconcile", "replay", "serve", "tables", "worker", "worlds",
)  # fmt: skip


def commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under ``group`` (groups included)."""
    out = []
    for name, command in sorted(group.commands.items()):
        out.append((*path, name))
        if isinstance(command, click.Group):
            out += commands(command, (*path, name))
    return out


def module_commands(name: str) -> list[click.Command]:
    """The click commands and groups a cli module defines at its top level."""
    module = importlib.import_module(f"cli.{name}")
    return [
        v for v in vars(module).values() if isinstance(v, click.Command) and v.callback.__module__ == module.__name__
    ]


def test_every_command_group_is_registered() -> None:
    assert sorted(cli.commands) == sorted(GROUPS)
    # the reachability check below sees a module's commands (a group and its subcommands)
    assert {c.name for c in module_commands("dlq")} == {"dlq", "list", "show", "redrive"}


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "cli").glob("*.py") if p.stem != "__init__"))
def test_every_command_a_cli_module_defines_is_reachable(name: str) -> None:
    reachable = {id(cmd) for cmd in _walk(cli)}
    for command in module_commands(name):
        assert id(command) in reachable, f"cli/{name}.py defines `{command.name}` but `causeway` does not register it"


def _walk(group: click.Group) -> list[click.Command]:
    out: list[click.Command] = [group]
    for command in group.commands.values():
        out += _walk(command) if isinstance(command, click.Group) else [command]
    return out


def test_the_commands_are_registered_with_plain_imports() -> None:
    """No importlib: a command module that fails to import fails `causeway`, it is not silently left out."""
    tree = ast.parse((ROOT / "cli" / "main.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "importlib" not in imported


@pytest.mark.parametrize("path", commands(cli), ids=" ".join)
def test_every_command_answers_help(path: tuple[str, ...]) -> None:
    out = CliRunner().invoke(cli, [*path, "--help"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("Usage: ")
    assert " ".join(path) in out.output.splitlines()[0]
