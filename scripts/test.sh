#!/usr/bin/env bash
# The whole test suite: the static checks (scripts/check.sh: ruff, import contracts, mypy; it stops
# at the first failure), then unit tests and integration tests against the real Kafka, Redis, Nessie
# and Prometheus. Installs what is missing and starts the services first (both are no-ops when done);
# leaves the services running so a second run is quick (`scripts/services.sh stop` ends them).
#   scripts/test.sh                 everything
#   scripts/test.sh --unit          the static checks and the unit tests only: no service is started
#   scripts/test.sh -k causal       extra arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
unit=0
if [[ "${1:-}" == "--unit" ]]; then
  unit=1
  shift
fi
scripts/setup.sh
scripts/check.sh
if [[ $unit -eq 1 ]]; then
  exec .venv/bin/python -m pytest tests/unit "$@"
fi
scripts/services.sh start
eval "$(scripts/services.sh env)"
exec .venv/bin/python -m pytest "$@"
