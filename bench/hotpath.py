"""CPU per event of the worker's hot path on the real services, commit apart (a quick, repeatable measure).

Preloads a benchmark-profile workload (``small`` by default: 50k records, 3 worlds) on fresh topics,
then drains it in this process through the worker's own pieces wired as ``agents.worker`` wires them
(``ChangeIntake`` → pipelined ``Applier`` → Redis marks, dead-letter decisions, the DLQ publisher,
``BatchCommitter`` on a fresh branch per world) against the running Kafka, Redis and Nessie, without
Faust's web server and timers. Reports CPU seconds (``time.process_time``: every thread, not wall
time, the box is shared) per 1,000 records, split into the commit (``BatchCommitter.commit_batch``,
in worker threads: the process CPU less the event loop's thread) and the event loop (the hot path outside the commit).

    python -m bench.hotpath                       # small profile
    python -m bench.hotpath --profile tiny --json
    python -m bench.hotpath --rate 5000           # published at 5,000/s while it drains (small polls)
    py-spy record --rate 250 --format raw -o hot.txt -- .venv/bin/python -m bench.hotpath
    python -m bench.profiling hot.txt --stages    # µs per event per stage, from the samples

With ``--rate`` the records are published at that rate by a child process (its CPU is not the
worker's) while the drain runs, as the benchmark's latency phases offer them: polls are then small
and each poll's fixed work (Redis round trips, the offset commit) counts per event, as it does in
the 5,000/s phase of ``python -m bench run``; without it the preload is drained in full polls.

Topics, the DLQ topic and the branches it creates carry a unique id and are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from agents.applier import Applier
from agents.deadletter_publisher import DeadLetterPublisher
from agents.intake import ChangeIntake
from agents.marks import AppliedMarks, DeadLetterMarks
from agents.worker import GC_THRESHOLD, _Worlds
from bench.profiles import PROFILES
from cli.workload import generate
from models.events import EntityKind
from models.worlds import WorldNaming
from monitoring.metrics import Metrics
from sinks.committer import BatchCommitter
from sinks.nessie import Reference, SyncNessieClient
from streams.security import kafka_client_options, redis_options
from streams.settings import Settings
from streams.topics import ensure_topics


class _CommitClock:
    """Thread CPU spent inside ``BatchCommitter.commit_batch`` (it runs in worker threads)."""

    def __init__(self, committer: BatchCommitter) -> None:
        self.cpu = 0.0
        self.commits = 0
        self._lock = threading.Lock()
        inner = committer.commit_batch

        def timed(batch: Any) -> Any:
            t0 = time.thread_time()
            try:
                return inner(batch)
            finally:
                spent = time.thread_time() - t0
                with self._lock:
                    self.cpu += spent
                    self.commits += 1

        committer.commit_batch = timed  # type: ignore[method-assign]


async def _publish(settings: Settings, records: list[Any], rate: int = 0) -> None:
    """Publish ``records``: all at once, or at ``rate`` a second in 10 ms ticks (the benchmark's
    latency phases' pacing), never ahead of the clock."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        linger_ms=5,
        max_batch_size=512 * 1024,
        acks=1,
        **kafka_client_options(settings),
    )
    await producer.start()
    try:
        start, sent, futures = time.monotonic(), 0, []
        while sent < len(records):
            due = min(len(records), int((time.monotonic() - start) * rate) + 1) if rate else len(records)
            for r in records[sent:due]:
                topic = settings.objects_topic if r.kind is EntityKind.OBJECT else settings.links_topic
                futures.append(await producer.send(topic, r.value, key=r.key))
                if len(futures) >= 20_000:
                    await asyncio.gather(*futures)
                    futures.clear()
            sent = due
            if rate:
                await asyncio.sleep(0.01)
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def _publish_paced_process(settings: Settings, records: list[Any], rate: int) -> None:
    asyncio.run(_publish(settings, records, rate))


async def _drain(settings: Settings, expected: int, timeout_s: float) -> dict[str, Any]:
    metrics = Metrics()
    committer = BatchCommitter(settings, on_retry=metrics.commit_retry)
    clock = _CommitClock(committer)
    applier = Applier(
        settings,
        marks=AppliedMarks.from_settings(settings, **redis_options(settings)),
        committer=committer,
        dead_letters=DeadLetterPublisher(settings.kafka_bootstrap, settings.dlq_topic, kafka_client_options(settings)),
        worlds=_Worlds(settings),
        metrics=metrics,
        worker_id=f"hotpath-{os.getpid()}",
        pipelined=True,
        dead_marks=DeadLetterMarks.from_url(settings.redis_url, settings.dedupe_ttl_s, **redis_options(settings)),
        cpu_clock=time.process_time,
    )
    intake = ChangeIntake(settings, applier, metrics)
    await intake.start()
    loop = asyncio.get_running_loop()
    # The event loop runs every step of the hot path but the commit, which runs in worker threads
    # (``asyncio.to_thread``, and pyiceberg's own pool for file writes): main-thread CPU is the
    # hot path outside the commit.
    cpu0, main0, wall0 = time.process_time(), time.thread_time(), time.monotonic()
    tasks = [loop.create_task(intake.run()), loop.create_task(intake.ticks())]

    def settled() -> int:
        t = applier.totals
        return sum(t.get(k, 0) for k in ("applied", "dead_lettered", "duplicates", "dead_letter_replays"))

    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(t.done() for t in tasks):
                for t in tasks:
                    if t.done():
                        t.result()  # raise what ended the loop
            if intake.stats["records"] >= expected and applier.tracker.in_flight() == 0:
                break
            await asyncio.sleep(0.05)
        cpu, main, wall = time.process_time() - cpu0, time.thread_time() - main0, time.monotonic() - wall0
    finally:
        await intake.stop()
        await applier.dlq.stop()  # type: ignore[attr-defined]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    n = intake.stats["records"]
    per_k = 1000 / max(1, n)
    return {
        "records": n,
        "settled": settled(),
        "totals": dict(applier.totals),
        "drained": n >= expected and applier.tracker.in_flight() == 0,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 3),
        "main_thread_cpu_s": round(main, 3),
        "commit_call_cpu_s": round(clock.cpu, 3),
        "commits": clock.commits,
        "cpu_s_per_1k": round(cpu * per_k, 4),
        "threads_cpu_s_per_1k": round((cpu - main) * per_k, 4),
        "commit_call_cpu_s_per_1k": round(clock.cpu * per_k, 4),
        "main_thread_cpu_s_per_1k": round(main * per_k, 4),
        "polls": intake.stats["polls"],
    }


async def _cleanup(settings: Settings, client: SyncNessieClient, branches: list[str]) -> None:
    for name in branches:
        try:
            client.delete_reference(name, client.get_reference(name).hash, "BRANCH")
        except Exception:  # noqa: BLE001 - a branch never created (world without events) is fine
            pass
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **kafka_client_options(settings))
    await admin.start()
    try:
        await admin.delete_topics([settings.objects_topic, settings.links_topic, settings.dlq_topic])
    finally:
        await admin.close()


async def run(profile_name: str, events: int | None, timeout_s: float, rate: int = 0) -> dict[str, Any]:
    profile = PROFILES[profile_name]
    u = uuid.uuid4().hex[:8]
    base = Settings.from_env()
    settings = base.replace(
        app_id=f"hot-{u}",
        objects_topic=f"hot.{u}.objects",
        links_topic=f"hot.{u}.links",
        dlq_topic=f"hot.{u}.dlq",
        main_branch=f"hot-{u}-main",
        warehouse=f"file://{tempfile.mkdtemp(prefix=f'causeway-hot-{u}-')}/warehouse",
        unknown_world_policy="create",
        topic_partitions=profile.partitions,
        batch_max_events=profile.batch_max_events,
        batch_max_seconds=profile.batch_max_seconds,
        causal_timeout_s=60.0,
    )
    params = profile.workload(f"h{u}-", f"{u}-", events)
    records = generate(params).records
    client = SyncNessieClient.from_settings(base)
    naming = WorldNaming(settings.prod_world, settings.main_branch)
    client.create_branch(settings.main_branch, Reference("main", "BRANCH", client.config().no_ancestor_hash))
    await ensure_topics(settings)
    publisher = None
    try:
        if rate:
            # A child process: the publisher's CPU is not the drain's.
            publisher = multiprocessing.get_context("spawn").Process(
                target=_publish_paced_process, args=(settings, records, rate), daemon=True
            )
            publisher.start()
        else:
            await _publish(settings, records)
        load_before = os.getloadavg()
        out = await _drain(settings, len(records), timeout_s)
        out["load_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    finally:
        if publisher is not None:
            publisher.join(timeout=30)
            if publisher.is_alive():
                publisher.terminate()
        await _cleanup(settings, client, [naming.branch(w) for w in params.world_ids()])
    out["profile"] = profile_name
    out["preloaded"] = len(records)
    out["rate"] = rate
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="example: python -m bench.hotpath --profile small --json"
    )
    ap.add_argument("--profile", default="small", choices=sorted(PROFILES))
    ap.add_argument("--events", type=int, default=None, help="records to preload (default: the profile's)")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up draining after this many seconds")
    ap.add_argument(
        "--rate", type=int, default=0, help="publish at this many records/s while draining (default: preload all first)"
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    gc.set_threshold(*GC_THRESHOLD)  # as the worker does
    out = asyncio.run(run(args.profile, args.events, args.timeout, args.rate))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{out['records']} records ({out['settled']} settled, drained={out['drained']}) in {out['wall_s']} s wall; "
            f"CPU s per 1k records: {out['cpu_s_per_1k']} all in, {out['main_thread_cpu_s_per_1k']} in the event "
            f"loop (the hot path outside the commit), {out['threads_cpu_s_per_1k']} in worker threads "
            f"({out['commit_call_cpu_s_per_1k']} in the {out['commits']} commit calls themselves); "
            f"load {out['load_before_after'][0]} -> {out['load_before_after'][1]}"
        )
    return 0 if out["drained"] else 1


if __name__ == "__main__":
    sys.exit(main())
