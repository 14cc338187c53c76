"""Loads ``bench.commit_probe`` into a ``causeway worker`` started with BENCH_COMMIT_PROBE set.

Only for benchmark runs: put this directory first on PYTHONPATH (see ``bench/commit_probe.py``).
Python imports ``sitecustomize`` at start-up in every process, so it checks it is a worker.
"""

import os
import sys

if os.environ.get("BENCH_COMMIT_PROBE") and "worker" in sys.argv:
    from bench.commit_probe import install

    install(os.environ["BENCH_COMMIT_PROBE"])
