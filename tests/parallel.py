"""How the suite runs in parallel test processes (pytest-xdist: ``scripts/test.sh`` passes ``-n 3``).

Every test uses its own topics, consumer group, branches, Redis keys, ports and files, so any two tests
can run at the same time, and the processes take tests one at a time as they finish (the slowest tests
wait on worker processes and the services, not on the CPU). The exceptions share something fixed and
are listed in ``SHARED`` (a test file, or one test of it, to a group name): the tests of one group run
in one process, one after another, as a single unit of work.

When a new test needs a fixed port, a module-scoped fixture that must start once, or any other
resource another test could hold at the same time, add it here (``tests/unit/test_parallel.py``
checks that every entry still names a test). pytest-xdist's own ``xdist_group`` marker would say the
same in the test file, but its ``--dist loadgroup`` no longer groups anything under pytest 9.2
(pytest-xdist issue 1386), so the groups are declared here and applied by ``SharedScheduling``.
"""

from __future__ import annotations

from typing import Any

SHARED: dict[str, str] = {
    # A module-scoped fixture starts the secured stack (~1 min of JVM start-up): once, in one process.
    "tests/integration/test_security_live.py": "secured-stack",
    # Fixed scrape ports (6067-6071, the list an older Prometheus config scraped): one user at a time.
    "tests/integration/test_metrics_live.py": "scrape-ports",
    "tests/integration/test_dashboards_live.py": "scrape-ports",
    "tests/integration/test_smoke.py::test_prometheus_scrapes_a_target_and_answers": "scrape-ports",
}


def group_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its ``SHARED`` group, or the test alone (its node id)."""
    path, _, name = nodeid.partition("::")
    for key in (f"{path}::{name.split('[', 1)[0]}", path):
        if key in SHARED:
            return f"group:{SHARED[key]}"
    return nodeid


def make_scheduler(config: Any, log: Any) -> Any:
    """pytest-xdist's scope scheduler with ``group_of`` as the scope (built on first use: xdist is
    imported only in a parallel run)."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Units of work are single tests and the SHARED groups; a process that is down to two
        pending tests gets the next unit, so the processes stay busy until the end. Units with more
        tests are handed out first (xdist's --loadscope-reorder, on by default), so a long group
        such as the secured stack's starts at once instead of ending the run alone."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return SharedScheduling(config, log)
