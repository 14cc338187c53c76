"""Loads a benchmark probe into a ``causeway worker``: ``bench.commit_probe`` when BENCH_COMMIT_PROBE
is set, ``bench.memory_probe`` when BENCH_MEMORY_PROBE is set, ``bench.timeline_probe`` when
BENCH_TIMELINE_PROBE is set.

Only for benchmark runs: put this directory first on PYTHONPATH (see those modules).
Python imports ``sitecustomize`` at start-up in every process, so it checks it is a worker.
"""

import os
import sys

if "worker" in sys.argv:
    if os.environ.get("BENCH_COMMIT_PROBE"):
        from bench.commit_probe import install

        install(os.environ["BENCH_COMMIT_PROBE"])
    if os.environ.get("BENCH_MEMORY_PROBE"):
        from bench.memory_probe import install as install_memory

        install_memory(
            os.environ["BENCH_MEMORY_PROBE"],
            float(os.environ.get("BENCH_MEMORY_PROBE_INTERVAL", "30")),
            release_every=int(os.environ.get("BENCH_MEMORY_PROBE_RELEASE_EVERY", "0")),
            trace_frames=int(os.environ.get("BENCH_MEMORY_PROBE_TRACE_FRAMES", "0")),
        )
    if os.environ.get("BENCH_TIMELINE_PROBE"):
        from bench.timeline_probe import install as install_timeline

        install_timeline(os.environ["BENCH_TIMELINE_PROBE"])
