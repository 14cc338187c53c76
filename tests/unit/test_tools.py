"""tests/tools.py: a test that needs promtool skips outside CI, with the reason, and fails in CI."""

from __future__ import annotations

import pytest

from tests.tools import require_promtool


def test_a_missing_promtool_skips_outside_ci_with_how_to_install_it(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="promtool is not installed.*scripts/services.sh fetch"):
        require_promtool()


def test_a_missing_promtool_fails_in_ci(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must have it"):
        require_promtool()


def test_an_installed_promtool_is_found(monkeypatch, tmp_path) -> None:
    tool = tmp_path / "promtool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert require_promtool() == str(tool)
