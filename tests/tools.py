"""External tools some tests need (not services): found on PATH, or the test says why it cannot run."""

from __future__ import annotations

import os
import shutil

import pytest

PROMTOOL_HINT = "promtool is not installed (Debian package prometheus; scripts/services.sh fetch installs it)"


def require_promtool() -> str:
    """The promtool binary's path. Missing: a failure in CI (env ``CI`` set), where it must be
    installed; elsewhere a skip whose reason says how to install it."""
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{PROMTOOL_HINT}; CI must have it", pytrace=False)
    pytest.skip(f"{PROMTOOL_HINT}: skipped outside CI (set CI=1 to make this a failure)")
