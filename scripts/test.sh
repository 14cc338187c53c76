#!/usr/bin/env bash
# The whole test suite: unit tests and integration tests against the real Kafka, Redis, Nessie and
# Prometheus. Installs what is missing and starts the services first (both are no-ops when done);
# leaves the services running so a second run is quick (`scripts/services.sh stop` ends them).
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not integration"` or `-k causal`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
scripts/services.sh start
eval "$(scripts/services.sh env)"
exec .venv/bin/python -m pytest "$@"
