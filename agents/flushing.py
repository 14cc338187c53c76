"""Pipelined flushes: a world's batch commits in the background while intake goes on.

Without this, the applier awaits every due world's Nessie commit inside ``process``, holding its
lock, so intake, dedupe and gating stop for the whole commit (about a second per round on the
small benchmark profile). Here:

* ``FlushScheduler.schedule`` starts one background task per due world and returns at once;
  a world has at most one flush in flight (its batches commit in order: a cause released into
  batch N must land no later than its effect in batch N+1), different worlds commit concurrently;
* each task runs the applier's own flush (take the batch, commit it, settle it: marks, gate,
  offsets) **without the applier's lock**, which the intake holds for a whole poll: a world's
  returned commit is settled, and its next batch started, while a poll is being deduped and gated.
  The applier keeps its guarantees on its own (``Applier._flush_in_background``): the tracker
  advances only after the commit, so acks stay in offset order; every state change is synchronous
  (one event loop thread), and the steps that await with the lock held tolerate a settle in their
  awaits (docs/architecture.md, "Pipelined flush and adaptive batching");
* when a flush ends, the worlds due by then are scheduled (its world again if a batch grew meanwhile);
* ``drain`` (rebalance, shutdown) waits for the flushes in flight and flushes every buffered world;
* a **commit budget** (:class:`CommitBudget`, ``CAUSEWAY_FLUSH_COMMIT_BUDGET``) bounds the commits
  in flight across worlds. With many worlds, each flushing on its own timer would start as many
  concurrent commits, every one slowed by the others (they share the GIL and the cores); within
  the budget, due worlds go in the order of their oldest buffered event (the event that has
  waited longest is the one whose latency grows), and the others' batches keep growing meanwhile
  (fewer, larger commits). A world just flushed starts a new batch, so it goes behind the worlds
  that waited: busy worlds take turns. ``W`` busy worlds sharing a budget of ``B`` commits of
  ``c`` seconds each flush every ``W·c/B`` seconds.

An error that escapes a flush (the applier retries dependency failures itself, so this is a bug)
is kept and raised by the next ``schedule`` or ``drain``: the intake then stops the worker rather
than running on without that world's flushes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from models.errors import WorkerError

log = logging.getLogger(__name__)


class CommitBudget:
    """Which due worlds may start a commit now: at most ``limit`` in flight (pure).

    ``due`` comes oldest batch first (``BatchAccumulator.due``: by when each world's oldest buffered
    event joined its batch), and that order is kept: the longest-waiting event goes first. A world
    already in flight is never picked (its next batch waits for it: batches of a world land in order).
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the commit budget must be at least 1")
        self.limit = limit

    def pick(self, due: Iterable[str], in_flight: Iterable[str]) -> list[str]:
        """The worlds to start now, in order."""
        busy = set(in_flight)
        free = self.limit - len(busy)
        if free <= 0:
            return []
        return [w for w in dict.fromkeys(due) if w not in busy][:free]


class FlushScheduler:
    """One background flush per world at a time, concurrently across worlds within a commit budget."""

    def __init__(
        self,
        flush: Callable[[str], Awaitable[None]],
        due: Callable[[], list[str]],
        buffered: Callable[[], Iterable[str]],
        budget: int = 4,
    ) -> None:
        self._flush = flush
        self._due = due
        self._buffered = buffered
        self.budget = CommitBudget(budget)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._held = 0
        self._error: BaseException | None = None

    def in_flight(self) -> set[str]:
        return set(self._tasks)

    def schedule(self, worlds: Iterable[str]) -> None:
        """Start a background flush of the due ``worlds`` the commit budget lets go now (none in
        flight for that world; not while draining). The rest are offered again when a flush ends."""
        self._raise_kept()
        if self._held:
            return
        self._start_within_budget(worlds)

    def _start_within_budget(self, worlds: Iterable[str]) -> None:
        for world in self.budget.pick(worlds, self._tasks):
            self._tasks[world] = asyncio.get_running_loop().create_task(self._run(world), name=f"flush {world}")

    async def _run(self, world: str) -> None:
        try:
            await self._flush(world)
        except asyncio.CancelledError:
            raise
        except WorkerError as exc:  # gave up on purpose (stopping, revoking): no traceback
            log.info("flush of world %s given up: %s", world, exc)
            self._error = self._error or exc
        except BaseException as exc:  # noqa: BLE001 - kept and raised where the intake sees it
            log.exception("flush of world %s failed", world)
            self._error = self._error or exc
        finally:
            self._tasks.pop(world, None)
        if not self._held and self._error is None:
            self.schedule(self._due())

    async def drain(self) -> None:
        """Wait for the flushes in flight, then flush every world with a buffered batch, until none."""
        self._held += 1
        try:
            while True:
                if self._tasks:
                    await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
                    continue
                self._raise_kept()
                worlds = list(self._buffered())
                if not worlds:
                    return
                self._start_within_budget(worlds)
        finally:
            self._held -= 1

    def _raise_kept(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
