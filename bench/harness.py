"""One benchmark run: the same preloaded input, three contenders, one after the other, on the same services.

For each contender (``ceiling``, ``causeway``, ``naive``):

1. its own copy of the change topics is preloaded with the *same* records (same keys, so the same
   partitions) before anything is timed; it gets its own consumer group, branches and warehouse;
2. its processes start; the clock starts when the broker reports the group Stable with every
   member (start-up is reported apart); the preload is "done" when the group's committed offsets
   reach every partition's end (each contender commits Kafka offsets only after its Nessie commit);
   the naive contender is capped by time and its measured rate is reported as such;
3. the latency phase: records of a second workload (fresh keys) are published at a steady
   ``latency_rate`` for ``latency_seconds``; each one's latency is the time from its Kafka
   timestamp (set when it was sent) to the Nessie commit that carries its offset, read from the
   branches' history — "visible on the branch". A capped naive run skips its backlog first;
4. figures: events/s, latency, Nessie commits and commit duration, peak RSS, CPU s per 1k events
   (the contender's processes; the services' CPU is reported apart), write amplification from the
   warehouse (every Parquet byte written, and the bytes no longer referenced by the final snapshots,
   per byte ingested) and metadata size.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from aiokafka import AIOKafkaProducer

from bench import cdc_latency, measure, publish
from bench.contender import ContenderConfig, quantiles_summary
from bench.procs import (
    PYTHON,
    ROOT,
    GroupWatch,
    Sampler,
    service_pids,
    start_worker,
    stop,
    wait_healthy,
    worker_env,
)
from bench.profiles import Profile
from cli.workload import CdcRecord, Record, Workload, WorkloadParams, debezium_mapping, debezium_records, generate
from models.events import EntityKind
from models.worlds import WorldNaming
from sinks.catalog import NessieCatalog
from sinks.nessie import Reference, SyncNessieClient
from sinks.tables import ENTITY_COMMON, ENTITY_EDGE, ENTITY_EVENTS
from streams.security import kafka_client_options, nessie_http_options, redact, redis_options, secret_values
from streams.settings import ARROW_POOL_ENV, Settings
from streams.topics import ensure_topics

RESULTS = ROOT / "bench" / "results"
Offsets = dict[tuple[str, int, int], tuple[int, int]]  # (topic, partition, offset) -> (timestamp ms, bytes)


T = TypeVar("T")


@dataclass
class Plan:
    """Names and settings of one contender in one run."""

    name: str
    topics: tuple[str, str]
    group: str
    branches: dict[str, str]  # world -> branch
    warehouse: str
    tables: tuple[str, ...]
    settings: Settings


@dataclass
class Phase:
    started: float = 0.0  # monotonic
    ready: float = 0.0
    ended: float = 0.0
    ended_epoch: float = 0.0
    settled: int = 0
    before_ready: int = 0  # settled before the group was Stable with every member (not timed)
    lag: int = 0
    cpu: float = 0.0
    services_cpu: dict[str, float] = field(default_factory=dict)
    # What the contender did during the phase (``phase_figures``).
    worker: dict[str, Any] = field(default_factory=dict)


#: Worker histograms reported per latency phase (the difference across the phase): where an event's
#: publish-to-visible time goes between waiting for its world's flush and the commit itself.
PHASE_HISTOGRAMS = {
    "flush_wait_s": "causeway_flush_wait_seconds",
    "commit_s": "causeway_commit_duration_seconds",
    "batch_rows": "causeway_batch_rows",
}


@dataclass(frozen=True)
class Mark:
    """A point of a run that phases are measured between: time, the contender's CPU, worker metrics."""

    at: float  # monotonic
    cpu_s: float
    texts: list[str]


def mark(sampler: Sampler, handles: Sequence[Any]) -> Mark:
    """Now, with the live causeway workers' metrics texts (none for other contenders)."""
    texts = []
    for h in handles:
        if hasattr(h, "metrics_text") and h.alive():
            try:
                texts.append(h.metrics_text())
            except httpx.HTTPError:
                pass
    return Mark(time.monotonic(), sampler.cpu_now()[0], texts)


def phase_figures(before: Mark, after: Mark) -> dict[str, Any]:
    """What the contender did between two marks: its CPU per wall second (1.0: a core, or the GIL,
    busy throughout) and PHASE_HISTOGRAMS summed over workers."""
    wall = after.at - before.at
    out: dict[str, Any] = {
        "wall_s": round(wall, 2),
        "cpu_s": round(after.cpu_s - before.cpu_s, 2),
        "cpu_per_wall": round((after.cpu_s - before.cpu_s) / wall, 3) if wall > 0 else None,
    }
    for key, name in PHASE_HISTOGRAMS.items():
        observed = measure.histogram_sample(after.texts, name) - measure.histogram_sample(before.texts, name)
        out[key] = measure.summarize(observed)
    return out


class Run:
    def __init__(
        self,
        profile: Profile,
        *,
        out_dir: Path = RESULTS,
        work_dir: Path | None = None,
        py_spy: bool = False,
        log: Any = print,
    ) -> None:
        self.profile = profile
        self.unique = uuid.uuid4().hex[:8]
        self.out_dir = out_dir
        self.work = work_dir or Path(tempfile.mkdtemp(prefix=f"causeway-bench-{self.unique}-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.base = Settings.from_env()
        self.client = SyncNessieClient.from_settings(self.base)
        self.root_hash = self.client.config().no_ancestor_hash
        self.py_spy = py_spy
        self.log = log
        self.params = profile.workload(f"b{self.unique}-", f"{self.unique}-")
        self.latency_params = self._latency_params(profile.latency_rate, profile.seed + 1, "lat")
        # One more paced phase per extra rate, each with its own ids and keys (fresh, as the first one).
        self.extra_latency_params = {
            rate: self._latency_params(rate, profile.seed + 2 + i, f"lat{rate}")
            for i, rate in enumerate(profile.extra_latency_rates)
        }

    def _latency_params(self, rate: int, seed: int, tag: str) -> WorkloadParams:
        """A latency phase's workload: ``rate`` × ``latency_seconds`` events on fresh keys, no duplicates."""
        profile = self.profile
        events = max(1, int(rate * profile.latency_seconds))
        return WorkloadParams(
            events=events,
            worlds=profile.worlds,
            keys=max(10, min(profile.keys, events // 2)),
            seed=seed,
            causal_share=profile.causal_share,
            late_cause_share=profile.late_cause_share,
            duplicate_rate=0.0,
            bad_rate=0.0,
            world_prefix=f"b{self.unique}-",
            id_prefix=f"{self.unique}-{tag}-",
            pk_prefix=tag,
        )

    # --- plans -----------------------------------------------------------------------------------

    def plan(self, name: str) -> Plan:
        u = self.unique
        topics = (f"bench.{u}.{name}.objects", f"bench.{u}.{name}.links")
        warehouse = f"file://{self.work}/{name}/warehouse"
        worlds = self.params.world_ids()
        if name == "causeway":
            settings = self.base.replace(
                app_id=f"bench-{u}-causeway",
                objects_topic=topics[0],
                links_topic=topics[1],
                dlq_topic=f"bench.{u}.causeway.dlq",
                main_branch=f"bench-{u}-cw-main",
                warehouse=warehouse,
                unknown_world_policy="create",
                topic_partitions=self.profile.partitions,
                batch_max_events=self.profile.batch_max_events,
                batch_max_seconds=self.profile.batch_max_seconds,
                causal_timeout_s=60.0,
                log_level="warning",
            )
            naming = WorldNaming(settings.prod_world, settings.main_branch)
            branches = {w: naming.branch(w) for w in worlds}
            tables: tuple[str, ...] = (ENTITY_EVENTS, ENTITY_COMMON, ENTITY_EDGE)
        else:
            settings = self.base.replace(
                objects_topic=topics[0],
                links_topic=topics[1],
                warehouse=warehouse,
                topic_partitions=self.profile.partitions,
            )
            short = "nv" if name == "naive" else "cl"
            branches = {w: f"bench-{u}-{short}-{w}" for w in worlds}
            tables = (ENTITY_EVENTS,) if name == "ceiling" else (ENTITY_EVENTS, ENTITY_COMMON, ENTITY_EDGE)
        return Plan(name, topics, f"bench-{u}-{name}", branches, warehouse, tables, settings)

    def _branch_from_root(self, name: str) -> None:
        self.client.create_branch(name, Reference("main", "BRANCH", self.root_hash))

    # --- Kafka -----------------------------------------------------------------------------------

    async def _publish(self, plan: Plan, records: Sequence[Record | CdcRecord], rate: float | None = None) -> Offsets:
        """Publish ``records`` to the plan's topics (as fast as possible, or paced at ``rate``/s)."""
        producer = AIOKafkaProducer(
            bootstrap_servers=self.base.kafka_bootstrap,
            linger_ms=5,
            max_batch_size=512 * 1024,
            acks=1,
            **kafka_client_options(self.base),
        )
        await producer.start()
        out: Offsets = {}
        try:
            futures: list[tuple[Any, int]] = []
            started = time.monotonic()
            tick = max(1, int((rate or 0) / 100))
            for i, r in enumerate(records):
                if isinstance(r, CdcRecord):
                    topic = r.topic
                else:
                    topic = plan.topics[0] if r.kind is EntityKind.OBJECT else plan.topics[1]
                futures.append((await publish.send(producer, topic, r.value, key=r.key), len(r.value)))
                if rate and (i + 1) % tick == 0:
                    delay = started + (i + 1) / rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                if len(futures) >= 20_000:
                    await self._settle_futures(futures, out)
            await self._settle_futures(futures, out)
        finally:
            await producer.stop()
        return out

    @staticmethod
    async def _settle_futures(futures: list[tuple[Any, int]], out: Offsets) -> None:
        metas = await asyncio.gather(*(f for f, _ in futures))
        for meta, (_, size) in zip(metas, futures, strict=True):
            out[(meta.topic, meta.partition, meta.offset)] = (meta.timestamp, size)
        futures.clear()

    # --- processes -------------------------------------------------------------------------------

    def _start(self, plan: Plan, index: int) -> tuple[subprocess.Popen[bytes], Any]:
        log = self.work / f"{plan.name}-{index}.log"
        if plan.name == "causeway":
            # every worker starts at once and is waited for afterwards: the first to be up consumes alone
            worker = start_worker(worker_env(plan.settings), log, wait=False)
            return worker.proc, worker
        cfg = ContenderConfig(
            name=plan.name,
            bootstrap=self.base.kafka_bootstrap,
            topics=list(plan.topics),
            group=plan.group,
            branches=plan.branches,
            warehouse=plan.warehouse,
            stats_path=str(self.work / f"{plan.name}-{index}.stats.json"),
            namespace=self.base.namespace,
            batch_size=self.profile.naive_batch if plan.name == "naive" else self.profile.ceiling_batch,
            redis_url=self.base.redis_url,
            redis_prefix=f"bench:{self.unique}:processed:",
            expire_every=self.base.snapshot_expire_every,
            target_file_bytes=self.base.target_file_bytes,
        )
        cfg_path = self.work / f"{plan.name}-{index}.json"
        cfg.dump(cfg_path)
        env = worker_env(self.base)
        proc = subprocess.Popen(
            [PYTHON, "-m", f"bench.{plan.name}", str(cfg_path)],
            cwd=ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        return proc, cfg

    def _start_ingest(self, plan: Plan, source: str) -> subprocess.Popen[bytes]:
        """``python -m agents.cdc`` reading this run's ``cdc.raw.<source>.*`` into causeway's change topics."""
        env = worker_env(plan.settings) | {
            "CAUSEWAY_CDC_MAPPING": json.dumps(debezium_mapping(source)),
            "CAUSEWAY_CDC_PATTERN": rf"^cdc\.raw\.{source}\..*",
            "CAUSEWAY_CDC_GROUP_ID": f"{plan.group}-cdc",
        }
        log = (self.work / "cdc-ingest.log").open("wb")
        return subprocess.Popen([PYTHON, "-m", "agents.cdc"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def _attach_py_spy(self, pid: int, name: str) -> subprocess.Popen[bytes] | None:
        # The venv's own first; then PATH (a profiler kept outside the project's venv).
        found = Path(PYTHON).parent / "py-spy"
        exe = str(found) if found.exists() else shutil.which("py-spy")
        if exe is None:
            self.log("  py-spy not in the venv nor on PATH: no profile (pip install py-spy)")
            return None
        out = self.work / f"{name}-{pid}.pyspy.txt"
        return subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", "50", "--nonblocking", "--format", "raw", "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=(self.work / f"{name}-{pid}.pyspy.log").open("wb"),
        )

    # --- one contender ---------------------------------------------------------------------------

    async def contender(
        self,
        name: str,
        records: list[Record],
        latency_records: list[Record],
        extra_latency: dict[int, list[Record]] | None = None,
    ) -> dict[str, Any]:
        plan = self.plan(name)
        p = self.profile
        await ensure_topics(plan.settings)
        if name == "causeway":
            self._branch_from_root(plan.settings.main_branch)
        else:
            for branch in plan.branches.values():
                self._branch_from_root(branch)
        cdc: list[CdcRecord] = []
        source = f"bench{self.unique}"
        if p.debezium and name == "causeway":
            # The same changes as Debezium envelopes; the CDC ingest runs in front of the workers.
            cdc = debezium_records(Workload(self.params, records), source)
            await ensure_topics(plan.settings, {t: p.partitions for t in sorted({r.topic for r in cdc})})
        self.log(f"[{name}] preloading {len(records)} records" + (" as Debezium envelopes" if cdc else ""))
        preload = await self._publish(plan, cdc or records)
        sampler = Sampler(services=service_pids())
        sampler.start()
        procs: list[subprocess.Popen[bytes]] = []
        handles: list[Any] = []
        spies: list[subprocess.Popen[bytes]] = []
        a, b = Phase(), Phase()
        # (offered rate, paced records, lag at the end, worker figures)
        extra_phases: list[tuple[int, Offsets, int, dict[str, Any]]] = []
        capped = stalled = False
        load_start = _load_1m()
        # (seconds since the group was ready, records settled, largest process's RSS MiB, all processes' MiB)
        memory: list[tuple[float, int, float, float]] = []

        def _memory_point(pr: Any) -> tuple[float, int, float, float]:
            return (
                round(time.monotonic() - a.ready, 1),
                pr.done,
                round(sampler.last_rss_per_process / 2**20, 1),
                round((sampler.rss_series[-1][1] if sampler.rss_series else 0) / 2**20, 1),
            )

        try:
            async with GroupWatch(self.base.kafka_bootstrap, plan.group, plan.topics, p.partitions) as watch:
                members = p.workers if name == "causeway" else 1
                a.started = time.monotonic()
                for i in range(members):
                    proc, handle = self._start(plan, i)
                    procs.append(proc)
                    handles.append(handle)
                    sampler.add(proc.pid)
                cdc_topics = sorted({r.topic for r in cdc})
                if cdc:
                    ingest = self._start_ingest(plan, source)
                    procs.append(ingest)
                    sampler.add(ingest.pid)

                # A member that joined early may have consumed while the others started (under load, for
                # minutes): the clock starts at "every member Stable", so only what settles after counts.
                # One member has no one to wait for: what it settled while the group formed counts (a
                # small preload may be drained by then, which would leave nothing timed).
                async def at_ready() -> tuple[int, tuple[float, dict[str, float]]]:
                    return ((await watch.progress()).done if members > 1 else 0), sampler.cpu_now()

                a.ready, (a.before_ready, (a.cpu, a.services_cpu)) = await ready_at(
                    watch,
                    members,
                    lambda: all(pr.poll() is None for pr in procs),
                    [functools.partial(wait_healthy, h, 120) for h in handles] if name == "causeway" else [],
                    at_ready,
                )
                if self.py_spy and name == "causeway":
                    spies = [s for s in (self._attach_py_spy(pr.pid, name) for pr in procs) if s]
                self.log(f"[{name}] {members} process(es) ready after {a.ready - a.started:.1f}s; draining")

                def alive() -> bool:
                    return all(pr.poll() is None for pr in procs)

                timeout = p.naive_cap_s if name == "naive" else p.drain_timeout_s
                stall = None if name == "naive" else p.stall_after_s
                if cdc:
                    async with GroupWatch(
                        self.base.kafka_bootstrap, f"{plan.group}-cdc", cdc_topics, p.partitions
                    ) as cdc_watch:
                        _, cdc_prog = await cdc_watch.wait_drained(timeout, alive, stall_after=stall)
                a.ended, prog = await watch.wait_drained(
                    timeout, alive, stall_after=stall, on_progress=lambda pr: memory.append(_memory_point(pr))
                )
                if cdc:
                    # records in = envelopes the ingest read; a stuck ingest leaves the change topics "drained"
                    prog = cdc_prog if prog.lag == 0 else prog
                a.ended_epoch = time.time()
                a.settled, a.lag = prog.done, prog.lag
                cpu_end, svc_end = sampler.cpu_now()
                a.services_cpu = {k: round(v - a.services_cpu.get(k, 0.0), 2) for k, v in svc_end.items()}
                a.cpu = cpu_end - a.cpu
                capped = prog.lag > 0
                stalled = capped and name != "naive"
                self.log(
                    f"[{name}] preload: {a.settled} settled in {a.ended - a.ready:.1f}s"
                    + (f" (capped at {timeout:.0f}s, {prog.lag} left)" if capped and not stalled else "")
                    + (f" (DID NOT DRAIN: stalled or timed out, {prog.lag} left)" if stalled else "")
                )
                if capped:
                    # Skip the backlog so the latency phase measures fresh records, not the queue.
                    stop(procs)
                    await watch.reset_to_end()
                    for i in range(members):
                        proc, handle = self._start(plan, members + i)
                        procs.append(proc)
                        handles.append(handle)
                        sampler.add(proc.pid)
                    procs = procs[members:]
                    await watch.wait_ready(members, 120, alive)
                b.started = time.monotonic()
                b.cpu, _ = sampler.cpu_now()
                marked = mark(sampler, handles)
                if cdc:
                    # Envelopes are published; their events' change-topic offsets are found afterwards.
                    lat_cdc = debezium_records(Workload(self.latency_params, latency_records), source)
                    await ensure_topics(plan.settings, {t: p.partitions for t in {r.topic for r in lat_cdc}})
                    starts = await cdc_latency.end_offsets(self.base.kafka_bootstrap, plan.topics, p.partitions)
                    self.log(f"[{name}] latency phase: {len(lat_cdc)} Debezium envelopes at {p.latency_rate}/s")
                    sent = await self._publish(plan, lat_cdc, rate=p.latency_rate)
                    async with GroupWatch(
                        self.base.kafka_bootstrap, f"{plan.group}-cdc", cdc_topics, p.partitions
                    ) as cdc_watch:
                        await cdc_watch.wait_drained(p.latency_drain_s, alive)
                    b.ended, prog_b = await watch.wait_drained(p.latency_drain_s, alive)
                    changes = await cdc_latency.read_changes(self.base.kafka_bootstrap, starts)
                    paced = cdc_latency.latency_offsets(changes, cdc_latency.envelope_index(lat_cdc, sent))
                else:
                    self.log(f"[{name}] latency phase: {len(latency_records)} records at {p.latency_rate}/s")
                    paced = await self._publish(plan, latency_records, rate=p.latency_rate)
                    b.ended, prog_b = await watch.wait_drained(p.latency_drain_s, alive)
                b.settled, b.lag = prog_b.done, prog_b.lag
                b.cpu = sampler.cpu_now()[0] - b.cpu
                now = mark(sampler, handles)
                b.worker, marked = phase_figures(marked, now), now
                self.log(f"[{name}] latency phase at {p.latency_rate}/s: {b.worker}")
                for rate, recs in (extra_latency or {}).items():
                    if cdc:
                        self.log(f"[{name}] latency phase at {rate}/s skipped: --debezium runs one rate")
                        continue
                    self.log(f"[{name}] latency phase: {len(recs)} records at {rate}/s")
                    paced_r = await self._publish(plan, recs, rate=rate)
                    _, prog_r = await watch.wait_drained(p.latency_drain_s, alive)
                    now = mark(sampler, handles)
                    extra_phases.append((rate, paced_r, prog_r.lag, phase_figures(marked, now)))
                    self.log(f"[{name}] latency phase at {rate}/s: {extra_phases[-1][3]}")
                    marked = now
                metrics_texts = []
                summaries = []
                if name == "causeway":
                    for h in handles:
                        if h.alive():
                            try:
                                metrics_texts.append(h.metrics_text())
                                summaries.append(h.summary())
                            except httpx.HTTPError:
                                pass
        finally:
            for s in spies:
                s.send_signal(2)  # SIGINT: py-spy writes its output
            for s in spies:
                try:
                    s.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    s.kill()
            stop(procs)
            sampler.stop()
        finished_epoch = time.time()
        figures = self._figures(
            plan, preload, paced, a, b, capped, sampler, metrics_texts, summaries, handles, finished_epoch, extra_phases
        )
        figures["stalled"] = stalled
        figures["load_avg_1m"] = [load_start, _load_1m()]  # this contender's start and end: compare the two
        figures["memory_curve"] = measure.thin(memory, 60)
        return figures

    def _figures(
        self,
        plan: Plan,
        preload: Offsets,
        paced: Offsets,
        a: Phase,
        b: Phase,
        capped: bool,
        sampler: Sampler,
        metrics_texts: list[str],
        summaries: list[dict[str, Any]],
        handles: list[Any],
        finished_epoch: float,
        extra_phases: Sequence[tuple[int, Offsets, int, dict[str, Any]]] = (),
    ) -> dict[str, Any]:
        name = plan.name
        hist = measure.read_history(self.client, plan.branches.values(), {self.root_hash})
        visible = hist.visible_at()
        latencies, censored = latency_of(paced, visible, finished_epoch)
        phases = [
            {
                "offered_rate": self.profile.latency_rate,
                "records": len(paced),
                "latency_s": measure.quantiles(latencies),
                "censored": censored,
                "lag": b.lag,
                "worker": b.worker,
            }
        ]
        everything = {**preload, **paced}
        for offered, paced_r, lag, worker in extra_phases:
            lat_r, censored_r = latency_of(paced_r, visible, finished_epoch)
            phases.append(
                {
                    "offered_rate": offered,
                    "records": len(paced_r),
                    "latency_s": measure.quantiles(lat_r),
                    "censored": censored_r,
                    "lag": lag,
                    "worker": worker,
                }
            )
            everything.update(paced_r)
        ingested = sum(size for key, (_, size) in everything.items() if key in visible)
        if self.profile.debezium and not capped:
            ingested += sum(size for _, size in preload.values())  # envelopes: every one was read
        wh = measure.warehouse_sizes(measure.warehouse_path(plan.warehouse))
        catalog = NessieCatalog.from_settings(plan.settings, next(iter(plan.branches.values())), client=self.client)
        live = measure.live_bytes(catalog, plan.branches.values(), self.base.namespace, plan.tables)
        events_visible = len(visible)
        if name == "causeway":
            commit_s = measure.histogram(metrics_texts, "causeway_commit_duration_seconds")
            details: dict[str, Any] = {
                "worker_totals": _sum_dicts(summaries),
                "occ_conflicts": measure.counter(metrics_texts, "causeway_occ_conflicts_total"),
                "commit_retries": measure.counter(metrics_texts, "causeway_commit_retries_total"),
            }
        else:
            stats = [json.loads(Path(h.stats_path).read_text()) for h in handles if Path(h.stats_path).exists()]
            raw = [x for st in stats for x in st.pop("commit_seconds_raw", [])]
            commit_s = quantiles_summary(raw)
            details = {"stats": stats}
        preload_s = a.ended - a.ready
        if capped and name == "naive":
            # The naive consumer never commits Kafka offsets past a deferred event, so its group offsets
            # understate its progress; count what its commits carried by the cap, plus what it skipped.
            in_commits = sum(1 for key, t in visible.items() if key in preload and t <= a.ended_epoch)
            last = details["stats"][0] if details["stats"] else {}
            a.settled = max(a.settled, in_commits + last.get("bad", 0) + last.get("duplicates", 0))
        rate, timed = preload_rate(a.settled, a.before_ready, preload_s)
        per_k = 1000.0 / timed if timed else 0.0
        return {
            "events_preloaded": len(preload),
            "events_settled": a.settled,
            "events_settled_before_ready": a.before_ready,
            "capped": capped,
            "startup_s": round(a.ready - a.started, 2),
            "preload_s": round(preload_s, 2),
            "events_per_s": rate,
            "latency_offered_rate": self.profile.latency_rate,
            "latency_records": len(paced),
            "latency_s": measure.quantiles(latencies),
            "latency_censored": censored,
            "latency_phases": phases,
            "nessie_commits": len(hist.commits),
            "commits_per_1k_events": round(1000 * len(hist.commits) / events_visible, 2) if events_visible else None,
            "commit_s": commit_s,
            "peak_rss_mb": round(sampler.peak_rss / 2**20, 1),
            "peak_rss_per_process_mb": round(sampler.peak_rss_per_process / 2**20, 1),
            "cpu_s_per_1k_events": round(a.cpu * per_k, 3),
            "services_cpu_s_per_1k_events": {k: round(v * per_k, 3) for k, v in a.services_cpu.items()},
            "bytes_ingested": ingested,
            "data_bytes_written": wh.data_bytes,
            "data_files_written": wh.data_files,
            "live_bytes": live,
            "write_amplification": round(wh.data_bytes / ingested, 3) if ingested else None,
            "rewrite_amplification": round(max(0, wh.data_bytes - live) / ingested, 3) if ingested else None,
            "metadata_bytes_written": wh.metadata_bytes,
            "metadata_bytes_per_1k_events": round(1000 * wh.metadata_bytes / events_visible)
            if events_visible
            else None,
            "current_metadata_json_bytes": wh.current_metadata_json_bytes,
            "events_visible": events_visible,
            "latency_phase_lag": b.lag,
            "details": details,
        }

    # --- the run ---------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        started = datetime.now(UTC)
        load_start = [round(x, 2) for x in os.getloadavg()]
        self.log(f"run {self.unique}: profile {self.profile.name}, work dir {self.work}, load {load_start}")
        t0 = time.monotonic()
        wl = generate(self.params)
        lat = generate(self.latency_params)
        self.log(f"generated {len(wl.records)} + {len(lat.records)} records in {time.monotonic() - t0:.1f}s")
        results: dict[str, Any] = {}
        contenders = self.profile.contenders
        if self.profile.debezium:
            contenders = tuple(n for n in contenders if n == "causeway")
            self.log("--debezium: only causeway runs (the CDC ingest is its front end; naive and ceiling have none)")
        extra = {rate: generate(params).records for rate, params in self.extra_latency_params.items()}
        for name in contenders:
            results[name] = await self.contender(name, wl.records, lat.records, extra)
            self.log(f"[{name}] {results[name]['events_per_s']} events/s, latency {results[name]['latency_s']}")
        doc = {
            "run": {
                "id": self.unique,
                "started": started.isoformat(timespec="seconds"),
                "seconds": round(time.monotonic() - t0, 1),
                "command": command_line(sys.argv),
                "profile": asdict(self.profile),
                "workload": {"records": len(wl.records), "valid": len(wl.valid_events), "bad": wl.bad_count},
                "machine": machine() | {"load_avg_start": load_start},
                "versions": versions(self.base),
                "work_dir": str(self.work),
            },
            "contenders": results,
            "ratios": ratios(results),
        }
        return doc


async def ready_at(
    watch: Any,
    members: int,
    alive: Callable[[], bool],
    health_waits: Sequence[Callable[[], object]],
    at_ready: Callable[[], Awaitable[T]],
    timeout: float = 120.0,  # noqa: ASYNC109 - a deadline
) -> tuple[float, T]:
    """When the group was first seen Stable with ``members`` members, watched *while* the health checks
    run, and what ``at_ready`` read at that moment (the CPU counters, the progress so far).

    A worker consumes from its assignment on, and its /health may answer seconds later: timing from
    after the health checks let a single worker drain a small preload before the clock started (the
    small profile's ratio read 1.7-2.0 on 50k records), and CPU read then missed what the drain cost.
    The health checks block, so they run in threads.
    """

    async def ready_then_read() -> tuple[float, T]:
        seen = await watch.wait_ready(members, timeout, alive)
        return seen, await at_ready()

    ready = asyncio.create_task(ready_then_read())
    try:
        for wait in health_waits:
            await asyncio.to_thread(wait)
        return await ready
    finally:
        ready.cancel()


def preload_rate(settled: int, before_ready: int, seconds: float) -> tuple[float, int]:
    """(events/s, events timed): only what settled between "every member Stable" and "drained" counts."""
    timed = max(0, settled - before_ready)
    return (round(timed / seconds, 1) if seconds > 0 else 0.0), timed


def command_line(argv: Sequence[str]) -> str | None:
    """``python -m bench …`` as typed, from ``sys.argv`` (whose first item is then bench/__main__.py)."""
    if not argv or Path(argv[0]).parent.name != "bench" or Path(argv[0]).name != "__main__.py":
        return None
    return " ".join(["python -m bench", *argv[1:]])


def _load_1m() -> float:
    return round(os.getloadavg()[0], 2)


def latency_of(paced: Offsets, visible: dict[Any, float], finished_epoch: float) -> tuple[list[float], int]:
    """Each paced record's publish-to-visible latency, and how many were not visible at the end.

    A record not visible counts with its age when the run finished (a lower bound).
    """
    latencies = []
    censored = 0
    for key, (ts_ms, _) in paced.items():
        seen = visible.get(key)
        if seen is None:
            censored += 1
            latencies.append(finished_epoch - ts_ms / 1000)
        else:
            latencies.append(max(0.0, seen - ts_ms / 1000))
    return latencies, censored


def _sum_dicts(dicts: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for d in dicts:
        for k, v in d.items():
            if isinstance(v, int | float):
                out[k] += int(v)
    return dict(out)


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """causeway / ceiling and causeway / naive for the headline figures."""
    cw = results.get("causeway")
    out: dict[str, Any] = {}
    if not cw:
        return out
    for other in ("ceiling", "naive"):
        o = results.get(other)
        if not o:
            continue
        r: dict[str, Any] = {}
        if o["events_per_s"]:
            r["events_per_s"] = round(cw["events_per_s"] / o["events_per_s"], 3)
        for q in ("p50", "p99"):
            if cw["latency_s"].get(q) and o["latency_s"].get(q):
                r[f"latency_{q}"] = round(cw["latency_s"][q] / o["latency_s"][q], 3)
        other_phases = {ph["offered_rate"]: ph for ph in o.get("latency_phases", [])[1:]}
        for ph in cw.get("latency_phases", [])[1:]:
            mine, theirs = ph["latency_s"].get("p99"), other_phases.get(ph["offered_rate"], {}).get("latency_s", {})
            if mine and theirs.get("p99"):
                r[f"latency_p99_at_{ph['offered_rate']}"] = round(mine / theirs["p99"], 3)
        if o["cpu_s_per_1k_events"]:
            r["cpu_s_per_1k_events"] = round(cw["cpu_s_per_1k_events"] / o["cpu_s_per_1k_events"], 3)
        if o["peak_rss_mb"]:
            r["peak_rss_mb"] = round(cw["peak_rss_mb"] / o["peak_rss_mb"], 3)
        out[f"causeway/{other}"] = r
    return out


def machine() -> dict[str, Any]:
    import psutil

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


def versions(settings: Settings) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {}
    for pkg in ("pyiceberg", "pyarrow", "aiokafka", "faust-streaming", "redis", "orjson", "httpx"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    try:
        http = nessie_http_options(settings)
        out["nessie"] = (
            httpx.get(f"{settings.nessie_url.reveal()}/config", timeout=5, **http).json().get("actualApiVersion")
        )
        cfg = httpx.get(settings.nessie_url.replace("/api/v2", "/api/v2/config"), timeout=5, **http).json()
        out["nessie_server"] = cfg.get("serverVersion") or cfg.get("specVersion")
    except (httpx.HTTPError, ValueError):
        pass
    # the Arrow pool every contender's C++ side allocates from (the worker's and the ceiling's alike:
    # they inherit the harness's, which the `cli` package sets from CAUSEWAY_ARROW_CPP_POOL)
    out["arrow_pool"] = os.environ.get(ARROW_POOL_ENV) or "pyarrow default"
    libs = os.environ.get("CAUSEWAY_KAFKA_LIBS", "")
    out["kafka"] = next((part for part in libs.split("/") if part.startswith("kafka-")), None)
    try:
        import redis

        out["redis_server"] = (
            redis.Redis.from_url(settings.redis_url, **redis_options(settings)).info("server").get("redis_version")
        )
    except Exception:  # noqa: BLE001 - a version is nice to have
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        out["causeway_git"] = rev.strip() + ("+dirty" if dirty.strip() else "")
    except OSError:
        pass
    return out


def save(doc: dict[str, Any], out_dir: Path = RESULTS) -> tuple[Path, Path]:
    from bench.report import markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = doc["run"]["started"].replace(":", "").replace("-", "")
    base = out_dir / f"{stamp}-{doc['run']['profile']['name']}-{doc['run']['id']}"
    json_path = base.with_suffix(".json")
    md_path = base.with_suffix(".md")
    # A last line of defence: no secret value of this run's settings reaches a result file.
    secrets = secret_values(Settings.from_env())
    json_path.write_text(redact(json.dumps(doc, indent=2, default=str), secrets))
    md_path.write_text(redact(markdown(doc), secrets))
    return json_path, md_path
