#!/usr/bin/env bash
# Install everything causeway needs on this machine: the Python environment (.venv, with the test
# extras) and the service downloads (Debian packages, Kafka and Nessie jars). Safe to run again:
# pip and Maven reuse their caches (~/.cache/pip, ~/.m2, ~/.cache/causeway).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${CAUSEWAY_PYTHON:-python3}"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "causeway needs Python 3.11+")'
if [[ ! -x .venv/bin/python ]]; then
  echo "[setup] creating .venv" >&2
  "$PY" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last install.
stamp=".venv/.causeway-installed"
if [[ ! -f "$stamp" ]] || [[ pyproject.toml -nt "$stamp" ]]; then
  echo "[setup] installing causeway and its test tools into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # The editable build prints setuptools' informational "Editable installation" notice as a warning
  # block; it is not about causeway, so a healthy first run stays free of WARNING lines.
  PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning}" .venv/bin/python -m pip install -q -e ".[dev]"
  touch "$stamp"
fi
scripts/services.sh fetch
