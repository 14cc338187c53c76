#!/usr/bin/env bash
# The README's first command: set everything up on this machine and run causeway on local defaults.
# Installs the Python environment and the services (cached after the first run), starts Kafka,
# Redis, Nessie and Prometheus, checks each with a round trip, then runs the demo: a worker, a
# sample workload, and a summary of what landed on each world branch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
t0=$SECONDS
scripts/setup.sh
scripts/services.sh start
eval "$(scripts/services.sh env)"
echo "== services (set up in $((SECONDS - t0))s)"
scripts/services.sh status || true
echo "== round trip through each service"
.venv/bin/causeway doctor
if .venv/bin/causeway demo --help >/dev/null 2>&1; then
  echo "== demo: worker + sample workload"
  .venv/bin/causeway demo "$@"
fi
echo
echo "Services keep running (logs in ${CAUSEWAY_RUN_DIR:-$ROOT/.causeway/run}); stop them with: scripts/services.sh stop"
