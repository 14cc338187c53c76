"""How the suite runs in parallel test processes (pytest-xdist: ``scripts/test.sh`` passes ``-n 3``).

Every test uses its own topics, consumer group, branches, Redis keys, ports and files, so any two tests
can run at the same time, and the processes take tests one at a time as they finish (the slowest tests
wait on worker processes and the services, not on the CPU). The exceptions share something fixed and
are listed in ``SHARED`` (a test file, or one test of it, to a group name): the tests of one group run
in one process, one after another, as a single unit of work.

Tests in ``EXCLUSIVE`` (a test file, or one test of it) run alone: their unit starts once every other
process has finished its work, and nothing runs beside it. Garbage collection marks every reference
of the shared Nessie and gives up when references keep changing while it marks, which other tests'
commits and branches do.

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


EXCLUSIVE_GROUP = "exclusive"
EXCLUSIVE: set[str] = {
    # GC marks every reference in Nessie: other tests' new branches and commits would keep it marking.
    "tests/integration/test_world_gc.py",
    # Interrupts a replay once its checkpoint moved; in the first parallel run the replay had finished
    # by the time the SIGINT arrived (exit 0, not 130). Alone it passed. (The later runs that still
    # ended 0 had SIGINT ignored, inherited from a suite started in the background; the test now
    # starts the replay with SIGINT at its default. Running alone keeps the replay slower than the signal.)
    "tests/integration/test_ops.py::test_ctrl_c_saves_the_checkpoint_and_the_summary_counts_that_run",
}
EXCLUSIVE_UNIT = f"group:{EXCLUSIVE_GROUP}"


def group_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its ``SHARED`` group, the exclusive unit, or the test alone
    (its node id)."""
    path, _, name = nodeid.partition("::")
    for key in (f"{path}::{name.split('[', 1)[0]}", path):
        if key in EXCLUSIVE:
            return EXCLUSIVE_UNIT
        if key in SHARED:
            return f"group:{SHARED[key]}"
    return nodeid


def next_unit(queued: list[str]) -> str | None:
    """The unit a process that asks for work gets: the first queued one that is not the exclusive unit."""
    return next((unit for unit in queued if unit != EXCLUSIVE_UNIT), None)


def exclusive_may_start(queued: list[str], others_pending: list[int]) -> bool:
    """The exclusive unit starts when it is all that is queued and the other processes have finished
    every test they were given (a process holds its last test until it gets more work or is told to
    stop, so the others are told to stop first)."""
    return queued == [EXCLUSIVE_UNIT] and not any(others_pending)


def make_scheduler(config: Any, log: Any) -> Any:
    """pytest-xdist's scope scheduler with ``group_of`` as the scope (built on first use: xdist is
    imported only in a parallel run)."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Units of work are single tests and the SHARED groups; a process that is down to two
        pending tests gets the next unit, so the processes stay busy until the end. Units with more
        tests are handed out first (xdist's --loadscope-reorder, on by default), so a long group
        such as the secured stack's starts at once instead of ending the run alone. The EXCLUSIVE
        unit comes last, on one process, after the others have stopped."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            unit = next_unit(list(self.workqueue))
            if unit is None:  # only the exclusive unit is left
                self._start_exclusive()
                return
            self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

        def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
            super().mark_test_complete(node, item_index, duration)
            self._start_exclusive()

        def remove_node(self, node: Any) -> str | None:
            crashed: str | None = super().remove_node(node)
            self._start_exclusive()
            return crashed

        def _start_exclusive(self) -> None:
            """Keep one process, tell the others to stop, and give the kept one the exclusive unit
            once the others have run everything they hold."""
            if list(self.workqueue) != [EXCLUSIVE_UNIT]:
                return
            live = [n for n in self.nodes if not n.shutting_down]
            if not live:
                return
            keep = live[0]
            for other in live[1:]:
                other.shutdown()
            others = [self._pending_of(work) for n, work in self.assigned_work.items() if n is not keep]
            if exclusive_may_start(list(self.workqueue), others):
                super()._assign_work_unit(keep)

    return SharedScheduling(config, log)
