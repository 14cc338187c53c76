"""Per-world batch accumulation: a world flushes when its batch is big enough, old enough, or the
intake has gone idle.

Each world is committed on its own branch, so each world has its own batch. A batch is due when it
holds ``max_events`` items or its first item was added ``max_seconds`` ago, or, while the intake is
idle, once its first item was added ``idle_age`` ago: ``idle_min_seconds``, stretched towards
``max_seconds`` while the worker is busy (:func:`busy_idle_age`, fed by :class:`CpuLoad`). Time is
passed in (a monotonic clock in the agent, any number in tests); nothing here reads the clock. Items
keep their order of addition, which the causal gate relies on (a cause is released before its effects).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class _Batch(Generic[T]):
    __slots__ = ("items", "started_at")

    def __init__(self, started_at: float) -> None:
        self.items: list[T] = []
        self.started_at = started_at


class BatchAccumulator(Generic[T]):
    """Buffers items per world and says which worlds are due to flush.

    Contract: ``now`` never goes backwards. Taking a world's batch empties it; the next item starts a
    new batch and a new age.
    """

    def __init__(self, max_events: int, max_seconds: float, idle_min_seconds: float = 0.0) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        if max_seconds < 0:
            raise ValueError("max_seconds must not be negative")
        if idle_min_seconds < 0:
            raise ValueError("idle_min_seconds must not be negative")
        self.max_events = max_events
        self.max_seconds = max_seconds
        # Never later than the age flush: an idle intake only ever brings a flush forward.
        self.idle_min_seconds = min(idle_min_seconds, max_seconds)
        #: The age at which an idle intake's batch is due now (``stretch`` moves it with the load).
        self.idle_age = self.idle_min_seconds
        self._batches: dict[str, _Batch[T]] = {}

    def stretch(self, load: float, busy_load: float) -> float:
        """Set ``idle_age`` for the worker's ``load`` (:func:`busy_idle_age`); returns it."""
        self.idle_age = busy_idle_age(self.idle_min_seconds, self.max_seconds, load, busy_load)
        return self.idle_age

    def add(self, world_id: str, item: T, now: float) -> bool:
        """Append ``item`` to the world's batch; True when that batch is now due by size."""
        batch = self._batches.get(world_id)
        if batch is None:
            batch = self._batches[world_id] = _Batch(now)
        batch.items.append(item)
        return len(batch.items) >= self.max_events

    def due(self, now: float, idle: bool = False, caught_up_at: float | None = None) -> list[str]:
        """Worlds whose batch reached ``max_events`` items or ``max_seconds`` of age, oldest first.

        ``idle``: the intake has caught up (its last poll was not full): a batch is due once its
        first item is ``idle_age`` old (``idle_min_seconds`` unless ``stretch`` moved it). With 0
        every non-empty batch is due at once; a little more lets a world's next commit carry the
        events of that while instead of starting back to back with its last one (a commit's cost is
        mostly fixed at low rates).

        ``caught_up_at``: when the intake last caught up with a backlog (its polls stopped being
        full). A batch started before then holds the rest of that backlog: while idle it is due at
        once, since waiting ``idle_min_seconds`` for a trickle that is not coming only delays its
        commit (the tail of every catch-up).
        """
        # Idle with no minimum: every batch, whatever ``now`` says of its age (a caller may pass
        # the time it read before its own items were added).
        at_once = idle and self.idle_age <= 0
        age = self.idle_age if idle else self.max_seconds
        backlog_by = caught_up_at if idle and caught_up_at is not None else float("-inf")
        ready = [
            (b.started_at, world)
            for world, b in self._batches.items()
            if at_once or len(b.items) >= self.max_events or now - b.started_at >= age or b.started_at < backlog_by
        ]
        return [world for _, world in sorted(ready)]

    def take(self, world_id: str) -> list[T]:
        """Remove and return the world's batch (empty if it has none)."""
        batch = self._batches.pop(world_id, None)
        return batch.items if batch else []

    def take_due(self, now: float) -> dict[str, list[T]]:
        """Remove and return every due batch, by world."""
        return {world: self.take(world) for world in self.due(now)}

    def take_all(self) -> dict[str, list[T]]:
        """Remove and return every batch, due or not (before a rebalance or shutdown)."""
        out = {world: b.items for world, b in self._batches.items()}
        self._batches.clear()
        return out

    def next_due_at(self) -> float | None:
        """When the oldest batch becomes due by age, or None when nothing is buffered."""
        if not self._batches:
            return None
        return min(b.started_at for b in self._batches.values()) + self.max_seconds

    def started_at(self, world_id: str) -> float | None:
        """When the world's current batch got its first item, or None when it has none."""
        batch = self._batches.get(world_id)
        return batch.started_at if batch else None

    def size(self, world_id: str | None = None) -> int:
        """Items buffered for ``world_id``, or for all worlds."""
        if world_id is not None:
            batch = self._batches.get(world_id)
            return len(batch.items) if batch else 0
        return sum(len(b.items) for b in self._batches.values())

    def worlds(self) -> Iterator[str]:
        """Worlds with a non-empty batch."""
        return iter(list(self._batches))


def busy_idle_age(idle_min: float, max_seconds: float, load: float, busy_load: float) -> float:
    """How old an idle intake's batch must be to flush, for a worker using ``load`` of a core.

    ``idle_min`` up to half of ``busy_load``, ``max_seconds`` from ``busy_load`` on, a straight line
    between; ``busy_load`` <= 0 never stretches. Why: a commit's cost is mostly fixed at these batch
    sizes (~50 ms of CPU, then ~40 µs an event, docs/benchmarks.md), so a busy worker that commits
    half as often spends that CPU on events instead; a worker with CPU to spare keeps the short wait
    and its low latency.
    """
    if busy_load <= 0 or max_seconds <= idle_min:
        return idle_min
    share = (load - busy_load / 2) / (busy_load / 2)
    return idle_min + (max_seconds - idle_min) * min(1.0, max(0.0, share))


class CpuLoad:
    """The share of a core a process used lately, from its CPU and wall clocks (pure: both passed in).

    Smoothed over about ``window_s`` of wall time, so one heavy commit does not swing the flush age
    and a sustained load moves it within a few seconds. Readings closer than ``min_step_s`` apart are
    gathered into the next one (a tick's few milliseconds say little).
    """

    def __init__(self, window_s: float = 3.0, min_step_s: float = 0.5) -> None:
        if window_s <= 0 or min_step_s <= 0:
            raise ValueError("window_s and min_step_s must be positive")
        self.window_s = window_s
        self.min_step_s = min_step_s
        self.load = 0.0
        self._last: tuple[float, float] | None = None

    def observe(self, wall: float, cpu: float) -> float:
        """Feed the clocks' current readings; returns the smoothed load."""
        if self._last is None:
            self._last = (wall, cpu)
            return self.load
        dt = wall - self._last[0]
        if dt < self.min_step_s:
            return self.load
        used = max(0.0, cpu - self._last[1]) / dt
        self._last = (wall, cpu)
        weight = min(1.0, dt / self.window_s)
        self.load += (used - self.load) * weight
        return self.load
