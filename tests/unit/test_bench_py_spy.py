"""``bench run --py-spy`` finds a profiler kept outside the project's venv (on PATH)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bench import harness


def _fake_py_spy(folder: Path) -> Path:
    folder.mkdir()
    exe = folder / "py-spy"
    exe.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _run_without_services(work: Path, lines: list[str]) -> harness.Run:
    run = harness.Run.__new__(harness.Run)
    run.work = work
    run.log = lines.append
    return run


def test_py_spy_on_path_is_used_when_the_venv_has_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = tmp_path / "venv-bin"
    venv_bin.mkdir()
    monkeypatch.setattr(harness, "PYTHON", str(venv_bin / "python"))
    tools = tmp_path / "tools"
    _fake_py_spy(tools)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")
    lines: list[str] = []
    proc = _run_without_services(tmp_path, lines)._attach_py_spy(4242, "causeway-0")
    assert proc is not None
    proc.wait(timeout=10)
    assert (tools / "args").read_text().split()[:3] == ["record", "--pid", "4242"]
    assert lines == []


def test_no_py_spy_anywhere_says_so_and_profiles_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = tmp_path / "venv-bin"
    venv_bin.mkdir()
    monkeypatch.setattr(harness, "PYTHON", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    lines: list[str] = []
    assert _run_without_services(tmp_path, lines)._attach_py_spy(4242, "causeway-0") is None
    assert len(lines) == 1 and "PATH" in lines[0]
