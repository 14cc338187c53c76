"""Processes and Kafka plumbing shared by the benchmark and the integration tests.

* :func:`free_port`, :func:`worker_env` and :func:`start_worker` run ``causeway worker`` as a real
  subprocess configured by a :class:`~streams.settings.Settings` (every field becomes its
  ``CAUSEWAY_*`` variable), exactly as an operator would start one.
* :func:`group_progress` and :func:`wait_group_ready` read a consumer group from the broker: how far
  it committed, and when its members hold every partition (the moment consumption can start).
* :class:`Sampler` polls psutil for the resident memory and CPU time of a set of processes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.lag import partition_lag
from streams.security import kafka_client_options
from streams.settings import Settings, env_name

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_env(settings: Settings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker process: ``base`` (default: ours) without CAUSEWAY_*, plus settings."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("CAUSEWAY_")}
    for name, value in vars(settings).items():
        env[env_name(name)] = value.reveal() if hasattr(value, "reveal") else str(value)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def summary(self) -> dict[str, int]:
        return httpx.get(f"http://127.0.0.1:{self.port}/summary", timeout=5).json()

    def metrics_text(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text


def start_worker(
    env: dict[str, str],
    log: Path,
    *,
    fault: str | None = None,
    wait: bool = True,
    argv: Sequence[str] | None = None,
    health: bool = True,
    timeout: float = 60.0,
    port: int | None = None,
) -> Worker:
    """Start ``causeway worker`` (or ``argv``); ``port`` (default: any free one) serves /health and /metrics.

    Waits for /health unless told not to.
    """
    port = port or free_port()
    env = dict(env, CAUSEWAY_WEB_PORT=str(port))
    if fault:
        env["CAUSEWAY_FAULT"] = fault
    argv = list(argv or (PYTHON, "-m", "cli.main", "worker"))
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    worker = Worker(proc, port, log)
    if wait and health:
        wait_healthy(worker, timeout)
    return worker


def wait_healthy(worker: Worker, timeout: float = 60.0) -> Worker:
    """Poll the worker's /health until it answers 200; raises with the log's tail if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not worker.alive():
            raise RuntimeError(f"worker exited at start-up; log:\n{worker.log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{worker.port}/health", timeout=1).status_code == 200:
                return worker
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"worker not healthy in {timeout:.0f}s; log:\n{worker.log.read_text()[-3000:]}")


def stop(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``: only the processes we started."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# --- Kafka ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupProgress:
    ends: dict[tuple[str, int], int]
    committed: dict[tuple[str, int], int]

    @property
    def lag(self) -> int:
        return sum(partition_lag(end, 0, self.committed.get(tp)) for tp, end in self.ends.items())

    @property
    def done(self) -> int:
        return sum(min(self.committed.get(tp, 0), end) for tp, end in self.ends.items())


#: How often a drain is polled. The ceiling drains the small profile in about a second, so a 0.2 s
#: poll put up to a fifth of its time on the poll (its rate read 40k or 49k events/s, never between).
DRAIN_POLL_S = 0.05


class GroupWatch:
    """One admin client and one consumer kept open to poll a group's progress cheaply."""

    def __init__(self, bootstrap: str, group: str, topics: Sequence[str], partitions: int) -> None:
        self.bootstrap = bootstrap
        self._options = kafka_client_options(Settings.from_env())
        self.group = group
        self.tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **self._options)
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **self._options)

    async def __aenter__(self) -> GroupWatch:
        await self._admin.start()
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()
        await self._admin.close()

    async def progress(self) -> GroupProgress:
        ends = await self._consumer.end_offsets(self.tps)
        committed = await self._admin.list_consumer_group_offsets(self.group)
        return GroupProgress(
            {(tp.topic, tp.partition): int(ends[tp]) for tp in self.tps},
            {
                (tp.topic, tp.partition): int(meta.offset)
                for tp, meta in committed.items()
                if meta is not None and meta.offset >= 0
            },
        )

    async def state(self) -> tuple[str, int]:
        """(group state, members); ``("Dead", 0)`` for a group the broker does not know."""
        resp = await self._admin.describe_consumer_groups([self.group])
        for r in resp:
            for g in r.groups:
                # DescribeGroups v0-v4 tuples: (error_code, group_id, state, protocol_type, protocol, members, ...)
                return str(g[2]), len(g[5])
        return "Dead", 0

    async def wait_ready(
        self,
        members: int,
        timeout: float,  # noqa: ASYNC109 - a deadline
        alive: Callable[[], bool] | None = None,
    ) -> float:
        """Wait until the group is Stable with ``members`` members; returns the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                raise RuntimeError(f"a process of group {self.group} died before the group was ready")
            state, n = await self.state()
            if state == "Stable" and n >= members:
                return time.monotonic()
            await asyncio.sleep(0.1)
        raise TimeoutError(f"group {self.group} not Stable with {members} member(s) in {timeout:.0f}s")

    async def wait_drained(
        self,
        timeout: float,  # noqa: ASYNC109 - a deadline
        alive: Callable[[], bool] | None = None,
        poll: float = DRAIN_POLL_S,
        stall_after: float | None = None,
        on_progress: Callable[[GroupProgress], None] | None = None,
    ) -> tuple[float, GroupProgress]:
        """Until the committed offsets reach every end, ``timeout`` passes, or nothing moved for
        ``stall_after`` seconds; returns (time, last progress). ``on_progress`` sees every poll."""
        deadline = time.monotonic() + timeout
        progress = await self.progress()
        moved_at, done = time.monotonic(), progress.done
        while time.monotonic() < deadline:
            progress = await self.progress()
            if on_progress is not None:
                on_progress(progress)
            if progress.lag == 0:
                return time.monotonic(), progress
            if progress.done != done:
                moved_at, done = time.monotonic(), progress.done
            elif stall_after is not None and time.monotonic() - moved_at > stall_after:
                return time.monotonic(), progress
            if alive is not None and not alive():
                raise RuntimeError(f"a process of group {self.group} died before the group drained")
            await asyncio.sleep(poll)
        return time.monotonic(), progress

    async def reset_to_end(self) -> None:
        """Commit the group's offsets at the partitions' ends (skip a backlog); the group must be empty."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False, **self._options
        )
        await consumer.start()
        try:
            consumer.assign(self.tps)
            ends = await consumer.end_offsets(self.tps)
            await consumer.commit({tp: int(ends[tp]) for tp in self.tps})
        finally:
            await consumer.stop()


# --- processes -----------------------------------------------------------------------------------


def services_run_dir(settings: Settings) -> Path:
    """The folder of scripts/services.sh's pid files: the parent of the Prometheus discovery folder its
    ``env`` exports — the services' checkout, also when the bench runs from another git worktree."""
    sd = Path(settings.prometheus_sd_dir) if settings.prometheus_sd_dir else Path(".causeway/run/prometheus-sd")
    return sd.parent if sd.is_absolute() else ROOT / sd.parent


def service_pids(run_dir: Path | None = None) -> dict[str, int]:
    """Pids of the native services started by scripts/services.sh (for their CPU share), if readable."""
    run_dir = run_dir or services_run_dir(Settings.from_env())
    out: dict[str, int] = {}
    for name in ("kafka", "nessie", "redis"):
        for candidate in (run_dir / f"{name}.server.pid", run_dir / f"{name}.pid"):
            try:
                pid = int(candidate.read_text().strip())
            except (OSError, ValueError):
                continue
            if psutil.pid_exists(pid):
                out[name] = pid
                break
    return out


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0))


@dataclass
class Sampler:
    """Samples RSS (sum and per process) and CPU seconds of some processes every ``interval`` seconds."""

    interval: float = 0.25
    pids: list[int] = field(default_factory=list)
    services: dict[str, int] = field(default_factory=dict)
    peak_rss: int = 0
    peak_rss_per_process: int = 0
    last_rss_per_process: int = 0  # the largest process's RSS in the latest sample
    rss_series: list[tuple[float, int]] = field(default_factory=list)
    _cpu: dict[int, float] = field(default_factory=dict)
    _cpu0: dict[int, float] = field(default_factory=dict)
    _svc0: dict[str, float] = field(default_factory=dict)
    _svc1: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, pid: int) -> None:
        with self._lock:
            self.pids.append(pid)

    def start(self) -> None:
        self._svc0 = self._service_cpu()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._sample()
        self._svc1 = self._service_cpu()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _service_cpu(self) -> dict[str, float]:
        out = {}
        for name, pid in self.services.items():
            try:
                out[name] = _cpu(psutil.Process(pid))
            except psutil.Error:
                pass
        return out

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.interval):
            total = self._sample()
            self.rss_series.append((round(time.monotonic() - t0, 2), total))

    def _sample(self) -> int:
        total = largest = 0
        with self._lock:
            pids = list(self.pids)
        for pid in pids:
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    rss = p.memory_info().rss
                    cpu = _cpu(p)
            except psutil.Error:
                continue
            total += rss
            largest = max(largest, rss)
            self.peak_rss_per_process = max(self.peak_rss_per_process, rss)
            self._cpu0.setdefault(pid, cpu)
            self._cpu[pid] = cpu
        self.peak_rss = max(self.peak_rss, total)
        self.last_rss_per_process = largest
        return total

    def cpu_now(self) -> tuple[float, dict[str, float]]:
        """Sample now: (CPU seconds of the tracked processes, CPU seconds of each service)."""
        self._sample()
        return self.cpu_seconds, self._service_cpu()

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds of the sampled processes since each was first seen (includes start-up)."""
        return sum(self._cpu.values())

    @property
    def service_cpu_seconds(self) -> dict[str, float]:
        return {k: round(self._svc1.get(k, v) - v, 2) for k, v in self._svc0.items()}
