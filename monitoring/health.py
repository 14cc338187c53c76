"""The worker's health model: its loops and its dependencies, liveness apart from readiness (pure).

A worker runs **loops** (the intake of change events, the CDC ingest, schema sync, the
reconciliation timer) and needs **dependencies** (Kafka, Redis, Nessie). Each loop registers a
progress probe: a callable returning :class:`LoopProgress` (when it last made progress, how many
records wait for it). Dependencies are set from outside (``agents.probes.dependency_watcher``
probes them on a timer). :func:`assess` turns both into a :class:`HealthReport`:

=========  =================================================================================
loop       ``ok`` progressed within ``stall_after_s``, or ``idle`` (nothing waits for it);
           ``stuck`` records wait (or, with ``waiting=None``, the loop must tick by itself)
           and it has not progressed for ``stall_after_s``; ``stopped`` its task ended.
dependency ``up``, ``down`` (with the probe's line), or ``unknown`` before the first probe.
live       no loop stopped, and no loop stuck while every dependency is up (a restart would
           help: an orchestrator's liveness probe should restart the worker).
ready      live, every dependency up, no loop stuck (route work here; otherwise wait: a
           restart would not bring a dependency back).
status     ``ok`` (ready), ``degraded`` (live, not ready), ``failing`` (not live).
=========  =================================================================================

The worker serves it at ``/health`` (200 when ready, else 503), ``/health/ready`` (the same) and
``/health/live`` (200 when live). docs/operations.md ("Health") documents it.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

LoopState = Literal["ok", "idle", "stuck", "stopped"]
DependencyVerdict = Literal["up", "down", "unknown"]
Status = Literal["ok", "degraded", "failing"]


@dataclass(frozen=True)
class LoopProgress:
    """What a loop's probe reports. Times are ``time.monotonic()`` seconds."""

    last_progress: float | None  # the last progress; None: never (its registration time counts)
    waiting: int | None  # records waiting for it; None: unknown, so it must progress on its own
    running: bool = True  # False once its task has ended
    detail: str = ""


@dataclass(frozen=True)
class LoopHealth:
    name: str
    state: LoopState
    seconds_since_progress: float
    waiting: int | None
    detail: str = ""


@dataclass(frozen=True)
class DependencyHealth:
    name: str
    verdict: DependencyVerdict
    detail: str = ""
    seconds_in_state: float = 0.0


@dataclass(frozen=True)
class HealthReport:
    status: Status
    live: bool
    ready: bool
    loops: tuple[LoopHealth, ...]
    dependencies: tuple[DependencyHealth, ...]
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "live": self.live,
            "ready": self.ready,
            "reasons": list(self.reasons),
            "loops": {
                lp.name: {
                    "state": lp.state,
                    "seconds_since_progress": round(lp.seconds_since_progress, 1),
                    "waiting": lp.waiting,
                    "detail": lp.detail,
                }
                for lp in self.loops
            },
            "dependencies": {
                d.name: {"state": d.verdict, "detail": d.detail, "seconds_in_state": round(d.seconds_in_state, 1)}
                for d in self.dependencies
            },
        }


def loop_state(now: float, registered_at: float, stall_after_s: float, p: LoopProgress) -> LoopHealth:
    """One loop's state (see the module table)."""
    since = now - (p.last_progress if p.last_progress is not None else registered_at)
    if not p.running:
        state: LoopState = "stopped"
    elif p.waiting == 0:
        state = "idle"
    elif since > stall_after_s:
        state = "stuck"
    else:
        state = "ok"
    return LoopHealth("", state, max(0.0, since), p.waiting, p.detail)


def assess(loops: Mapping[str, LoopHealth], dependencies: Mapping[str, DependencyHealth]) -> HealthReport:
    """The report for these loop and dependency states (see the module table)."""
    reasons: list[str] = []
    all_up = all(d.verdict == "up" for d in dependencies.values())
    for d in dependencies.values():
        if d.verdict != "up":
            reasons.append(f"{d.name} {d.verdict}" + (f": {d.detail}" if d.detail else ""))
    stopped = [n for n, lp in loops.items() if lp.state == "stopped"]
    stuck = [n for n, lp in loops.items() if lp.state == "stuck"]
    reasons += [f"loop {n} stopped" for n in stopped]
    reasons += [f"loop {n} stuck: no progress for {loops[n].seconds_since_progress:.0f}s" for n in stuck]
    live = not stopped and not (stuck and all_up)
    ready = live and all_up and not stuck
    status: Status = "ok" if ready else ("degraded" if live else "failing")
    named_loops = tuple(
        LoopHealth(n, lp.state, lp.seconds_since_progress, lp.waiting, lp.detail) for n, lp in loops.items()
    )
    return HealthReport(status, live, ready, named_loops, tuple(dependencies.values()), tuple(reasons))


@dataclass
class _Loop:
    probe: Callable[[], LoopProgress]
    stall_after_s: float
    registered_at: float


@dataclass
class _Dependency:
    verdict: DependencyVerdict = "unknown"
    detail: str = "not probed yet"
    since: float = 0.0


@dataclass
class Health:
    """The registry a worker keeps: loops register a probe, dependency probes report here."""

    clock: Callable[[], float] = time.monotonic
    _loops: dict[str, _Loop] = field(default_factory=dict)
    _deps: dict[str, _Dependency] = field(default_factory=dict)

    def register_loop(self, name: str, probe: Callable[[], LoopProgress], stall_after_s: float) -> None:
        self._loops[name] = _Loop(probe, stall_after_s, self.clock())

    def register_dependency(self, name: str) -> None:
        self._deps.setdefault(name, _Dependency(since=self.clock()))

    def set_dependency(self, name: str, up: bool, detail: str = "") -> None:
        dep = self._deps.setdefault(name, _Dependency(since=self.clock()))
        verdict: DependencyVerdict = "up" if up else "down"
        if verdict != dep.verdict:
            dep.since = self.clock()
        dep.verdict, dep.detail = verdict, detail

    def report(self) -> HealthReport:
        now = self.clock()
        loops = {}
        for name, lp in self._loops.items():
            try:
                progress = lp.probe()
            except Exception as exc:  # noqa: BLE001 - a broken probe is reported, never raised into /health
                progress = LoopProgress(None, None, detail=f"probe failed: {type(exc).__name__}: {exc}")
            loops[name] = loop_state(now, lp.registered_at, lp.stall_after_s, progress)
        deps = {n: DependencyHealth(n, d.verdict, d.detail, now - d.since) for n, d in self._deps.items()}
        return assess(loops, deps)


class StepMeter:
    """A progress probe from calls that complete: each completed call of the metered method (a poll
    and its handling, a timer's pass) is progress, so a loop that stops calling it, or hangs inside
    it, turns ``stuck``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last: float | None = None
        self.calls = 0

    def _done(self) -> None:
        self.last = self.clock()
        self.calls += 1

    def wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(method):

            async def metered_async(*args: Any, **kwargs: Any) -> Any:
                result = await method(*args, **kwargs)
                self._done()
                return result

            return metered_async

        def metered(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            self._done()
            return result

        return metered

    def progress(self) -> LoopProgress:
        return LoopProgress(self.last, None, detail=f"{self.calls} pass(es)")


def meter_method(obj: Any, name: str = "step", clock: Callable[[], float] = time.monotonic) -> StepMeter:
    """Meter ``obj.<name>`` (e.g. ``KafkaLoop.step``, which its ``run`` calls as ``self.step()``)."""
    meter = StepMeter(clock)
    setattr(obj, name, meter.wrap(getattr(obj, name)))
    return meter


class CounterMeter:
    """A progress probe from a monotonically growing count (e.g. events settled) and a waiting count:
    progress is any change of the count."""

    def __init__(
        self, count: Callable[[], int], waiting: Callable[[], int | None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.count, self.waiting, self.clock = count, waiting, clock
        self._seen: int | None = None
        self._last: float | None = None

    def progress(self) -> LoopProgress:
        value = self.count()
        if value != self._seen:
            self._seen, self._last = value, self.clock()
        return LoopProgress(self._last, self.waiting(), detail=f"count {value}")


def status_probe(
    status: Callable[[], Any],
    wall: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], LoopProgress]:
    """A progress probe from a loop's own ``status()`` (duck-typed, e.g. the CDC ingest's
    ``IngestStatus``): ``last_commit_at`` / ``started_at`` in Unix time, ``records_waiting``, and
    ``last_failure``. Progress is the last commit; waiting records without one make it stuck."""

    def probe() -> LoopProgress:
        st = status()
        last = getattr(st, "last_commit_at", None)
        if last is None:
            last = getattr(st, "started_at", None)
        mono = None if last is None else clock() - max(0.0, wall() - last)
        failure = getattr(st, "last_failure", None)
        return LoopProgress(mono, getattr(st, "records_waiting", None), detail=failure or "")

    return probe
