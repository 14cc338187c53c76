#!/usr/bin/env bash
# The whole test suite: the static checks (scripts/check.sh: ruff, import contracts, mypy; it stops
# at the first failure), then unit tests and integration tests against the real Kafka, Redis, Nessie
# and Prometheus. Installs what is missing and starts the services first (both are no-ops when done);
# leaves the services running so a second run is quick (`scripts/services.sh stop` ends them).
#   scripts/test.sh                 everything
#   scripts/test.sh --unit          the static checks and the unit tests only: no service is started
#   scripts/test.sh -m "not slow"   everything but the tests marked slow (worker kills, rebalances, live alerts)
#   scripts/test.sh -k causal       extra arguments go to pytest
# Tests run in CAUSEWAY_TEST_PROCESSES parallel pytest processes (pytest-xdist; default 3, 0 = this
# process only): most integration tests wait on worker processes and the services, so three processes
# finish the suite sooner than one even on 2 cores. A `-n N` of your own wins. Each test uses its own
# topics, group, branches, Redis keys and ports; the few that share a fixed resource are listed in
# tests/parallel.py and run in one process.
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
# The suite starts hundreds of Python processes (workers, API servers, CLI calls): let them share
# compiled bytecode in .causeway/pycache instead of compiling causeway's modules in each one
# (PYTHONDONTWRITEBYTECODE, if set, would forbid that; the cache stays out of the source tree).
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$ROOT/.causeway/pycache}"
unset PYTHONDONTWRITEBYTECODE
parallel=(-n "${CAUSEWAY_TEST_PROCESSES:-3}")
for arg in "$@"; do
  case "$arg" in
    -n | -n* | --numprocesses | --numprocesses=*) parallel=() ;;
  esac
done
if [[ $unit -eq 1 ]]; then
  exec .venv/bin/python -m pytest "${parallel[@]}" tests/unit "$@"
fi
scripts/services.sh start
eval "$(scripts/services.sh env)"
exec .venv/bin/python -m pytest "${parallel[@]}" "$@"
