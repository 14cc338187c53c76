#!/usr/bin/env bash
# The static checks, in order, stopping at the first that fails: ruff lint, ruff format, the import
# contracts of docs/architecture.md (import-linter, [tool.importlinter] in pyproject.toml), no test
# module importing another, and mypy ([tool.mypy]: the base level everywhere, strict for the pure
# modules). No service needed.
# scripts/test.sh runs it first. CAUSEWAY_VENV picks another environment (default: .venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${CAUSEWAY_VENV:-$ROOT/.venv}/bin"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
step() { echo "[check] $*" >&2; }
step "ruff check";          "$BIN/ruff" check --quiet .
step "ruff format --check"; "$BIN/ruff" format --check --quiet .
step "import contracts";    "$BIN/lint-imports" --no-cache >/tmp/causeway-lint-imports.$$ 2>&1 \
  || { sed -n '/^Contracts/,$p' /tmp/causeway-lint-imports.$$ >&2; rm -f /tmp/causeway-lint-imports.$$; exit 1; }
rm -f /tmp/causeway-lint-imports.$$
step "test modules import helpers, never other test modules"
if grep -rnE '^\s*(from tests\.(unit|integration)\.test_|from tests\.(unit|integration) import test_)' tests; then
  echo "[check] move what they share into a helper module (tests/factories.py, tests/fakes.py, ...)" >&2
  exit 1
fi
step "mypy";                "$BIN/mypy"
