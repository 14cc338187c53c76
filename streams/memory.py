"""The worker's native memory: which allocator holds Arrow's buffers, how many glibc arenas, and
handing back what the allocators keep free.

A flush makes large transient Arrow tables (the log's merge, the key lookup's concat, the writers'
copies) in whichever commit thread runs it. An allocator keeps what they freed for reuse; across
threads and size classes that is memory the process holds without using (docs/benchmarks.md,
"2026-12-01 evening: what grows in the worker's RSS during a soak"). These are process-wide
knobs, so the worker sets them once at start-up, before its threads exist.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from streams.settings import MEMORY_POOLS, SettingsError

#: ``mallopt`` parameter (glibc ``malloc.h``): the most arenas threads may spread over.
M_ARENA_MAX = -8


@functools.cache  # find_library runs `ldconfig -p` in a subprocess: once per process, not per release
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


@dataclass(frozen=True)
class Applied:
    """What ``configure`` set: Arrow's pool backend and glibc's arena cap (0: left as it was), and the
    pool Arrow's C++ code allocates from (chosen when libarrow loaded: ``ARROW_DEFAULT_MEMORY_POOL``)."""

    pool: str
    arena_max: int
    native: str = ""


def configure(pool: str, arena_max: int) -> Applied:
    """Make ``pool`` Arrow's default memory pool ("default": leave pyarrow's choice) and cap glibc's
    arenas at ``arena_max`` (0: glibc's default, 8 per core). Call before starting threads: an
    arena cap only binds threads that have not allocated yet. ``Settings`` has refused values out of
    range; a pool this pyarrow was built without is found only here."""
    if pool not in MEMORY_POOLS:
        raise SettingsError(f"memory pool {pool!r}: use one of {', '.join(MEMORY_POOLS)}")
    native = pa.default_memory_pool().backend_name  # before any override: what the C++ side uses
    if pool != "default":
        try:
            chosen = getattr(pa, f"{pool}_memory_pool")()
        except NotImplementedError as exc:
            raise SettingsError(f"memory pool {pool!r} is not built into this pyarrow: {exc}") from None
        pa.set_memory_pool(chosen)
    libc = _libc()
    if arena_max > 0 and libc is not None:
        libc.mallopt(M_ARENA_MAX, arena_max)
    return Applied(pa.default_memory_pool().backend_name, arena_max if libc is not None else 0, native)


def release() -> None:
    """Hand back to the OS what Arrow's pool and glibc keep free (``malloc_trim`` also returns the
    free pages inside each arena's heap, not only its top)."""
    pa.default_memory_pool().release_unused()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class Releaser:
    """Calls ``release`` every ``interval_s`` seconds from a daemon thread (0: never)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.releases = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="memory release", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            release()
            self.releases += 1


def admits(in_use: int, nbytes: int, limit: int) -> bool:
    """Whether a job of ``nbytes`` may start beside ``in_use`` bytes of others under ``limit``. Pure.

    A job larger than the whole budget still runs, alone: refusing it would stop its world's commits.
    """
    return in_use == 0 or in_use + nbytes <= limit


class NativeBudget:
    """Bytes of heavy native work (Arrow's transient tables) in flight at once across the commit threads.

    Several worlds' commits each make their largest transients (a log merge's inputs, its sorted copy,
    the writers' copies) in their own thread; run at once, their peaks add up, and the allocator keeps
    what the sum reached (docs/benchmarks.md, "2026-12-02 morning"). ``hold`` makes a job wait until
    it fits beside the others'; the waiting thread holds nothing heavy yet. ``limit`` 0: no bound.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("the native budget cannot be negative")
        self.limit = limit
        self.in_use = 0
        self.peak = 0
        self.waits = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        if self.limit == 0:
            yield
            return
        nbytes = max(0, nbytes)
        with self._cond:
            if not admits(self.in_use, nbytes, self.limit):
                self.waits += 1
                self._cond.wait_for(lambda: admits(self.in_use, nbytes, self.limit))
            self.in_use += nbytes
            self.peak = max(self.peak, self.in_use)
        try:
            yield
        finally:
            with self._cond:
                self.in_use -= nbytes
                self._cond.notify_all()
