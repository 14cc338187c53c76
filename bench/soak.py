"""Soak: causeway's workers under a steady offered load for a long time; do commit latency and memory stay flat?

    python -m bench soak --minutes 30 --rate 2000 --worlds 3 --workers 1

The load is published in chunks of one generated workload, re-stamped per chunk with fresh event ids
and keys (``restamp``: generating every chunk cost the publisher ~0.7 of a core at 5,000/s), so
the worlds' tables keep growing for the whole soak — flat commit latency therefore also means "cost
does not grow with table size". Every minute the harness records the workers' RSS, the commits and
mean commit duration of that window (from the workers' histogram) and the consumer lag; at the end it
reads the branches' history once and adds the e2e latency of a 1% sample of records per window.
The verdict compares the last three windows with the first three after a two-window warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer

from bench import measure, publish
from bench.cleanup import clean
from bench.harness import Run, machine, versions
from bench.procs import GroupWatch, Sampler, service_pids, stop
from bench.profiles import Profile
from cli.workload import generate
from models.events import EntityKind
from streams.security import kafka_client_options

WINDOW_S = 60.0
SAMPLE_EVERY = 100


#: The issue's bar: the last three windows at most this many times the first three after warm-up.
FLAT_RATIO = 1.3


def _flat(series: list[float], warmup: int = 2, span: int = 3, floor: float = 0.0) -> dict[str, Any]:
    """``floor``: a last-windows mean at or under it is flat whatever the ratio (a lag of a second's
    worth of events is caught up, even if the first windows happened to read 0)."""
    body = series[warmup:]
    if len(body) < 2 * span:
        return {"verdict": "too short", "first": None, "last": None}
    first = sum(body[:span]) / span
    last = sum(body[-span:]) / span
    ratio = last / first if first else None
    flat = last <= floor or (ratio is not None and ratio <= FLAT_RATIO)
    return {
        "first": round(first, 4),
        "last": round(last, 4),
        "ratio": round(ratio, 3) if ratio else None,
        "verdict": "flat" if flat else "growing",
    }


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    profile = Profile(
        "soak",
        events=0,
        worlds=args.worlds,
        keys=args.keys,
        workers=args.workers,
        contenders=("causeway",),
        latency_rate=args.rate,
    )
    run = Run(profile, out_dir=args.out, log=lambda m: print(m, flush=True))
    if getattr(args, "probe", None):
        _with_memory_probe(args.probe)
    plan = run.plan("causeway")
    from streams.topics import ensure_topics

    await ensure_topics(plan.settings)
    run._branch_from_root(plan.settings.main_branch)
    sampler = Sampler(services=service_pids())
    sampler.start()
    procs = []
    handles = []
    windows: list[dict[str, Any]] = []
    sampled: dict[tuple[str, int, int], tuple[float, int]] = {}  # key -> (publish time, window)
    duration = args.minutes * 60
    chunk_events = max(1_000, int(args.rate * 30))
    template = await asyncio.to_thread(chunk_template, run, chunk_events)
    try:
        async with GroupWatch(run.base.kafka_bootstrap, plan.group, plan.topics, profile.partitions) as watch:
            for i in range(args.workers):
                proc, handle = run._start(plan, i)
                procs.append(proc)
                handles.append(handle)
                sampler.add(proc.pid)
            await watch.wait_ready(args.workers, 120, lambda: all(p.poll() is None for p in procs))
            producer = AIOKafkaProducer(
                bootstrap_servers=run.base.kafka_bootstrap, linger_ms=5, acks=1, **kafka_client_options(run.base)
            )
            await producer.start()
            windower: asyncio.Task[None] | None = None
            try:
                started = time.monotonic()
                sent = 0
                chunk_no = 0
                prev_hist: dict[str, float] = {}
                # Windows are taken beside the publisher, not inside its loop: a slow scrape used to stop
                # publishing, and the paced loop then sent the missed seconds as one burst.
                windower = asyncio.create_task(
                    _windows(lambda i: _window(watch, sampler, handles, prev_hist, i), windows, started, duration)
                )
                while time.monotonic() - started < duration:
                    if windower.done():
                        windower.result()  # a window that failed stops the soak now, not at its end
                    records = restamp(template, chunk_no)
                    chunk_no += 1
                    futures = []
                    for kind, key, value in records:
                        topic = plan.topics[0] if kind is EntityKind.OBJECT else plan.topics[1]
                        fut = await publish.send(producer, topic, value, key=key)
                        sent += 1
                        if sent % SAMPLE_EVERY == 0:
                            futures.append((fut, len(windows)))
                        if sent % max(1, args.rate // 100) == 0:
                            delay = started + sent / args.rate - time.monotonic()
                            if delay > 0:
                                await asyncio.sleep(delay)
                        if time.monotonic() - started >= duration:
                            break
                    for fut, w in futures:
                        meta = await fut
                        sampled[(meta.topic, meta.partition, meta.offset)] = (meta.timestamp / 1000, w)
                await windower
            finally:
                if windower is not None:
                    windower.cancel()
                await producer.stop()
            await watch.wait_drained(getattr(args, "drain_seconds", 120.0))
    finally:
        stop(procs)
        sampler.stop()
    hist = measure.read_history(run.client, plan.branches.values(), {run.root_hash})
    visible = hist.visible_at()
    per_window: dict[int, list[float]] = {}
    for where, (t, win) in sampled.items():
        seen = visible.get(where)
        per_window.setdefault(win, []).append((seen - t) if seen else float("inf"))
    for i, window in enumerate(windows):
        lat = per_window.get(i, [])
        window["latency_s"] = measure.quantiles([x for x in lat if x != float("inf")])
        # bad input is dead-lettered and duplicates are settled without a commit: never visible
        window["not_visible_bad_or_duplicate"] = sum(1 for x in lat if x == float("inf"))
    doc = {
        "run": {
            "id": run.unique,
            "kind": "soak",
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "minutes": args.minutes,
            "rate": args.rate,
            "worlds": args.worlds,
            "workers": args.workers,
            "memory_probe": str(args.probe) if getattr(args, "probe", None) else None,
            "peak_rss_largest_worker_mb": round(sampler.peak_rss_per_process / 2**20, 1),
            "machine": machine(),
            "versions": versions(run.base),
        },
        "windows": windows,
        "commit_mean_s": _flat([w["commit_mean_s"] or 0.0 for w in windows]),
        "rss_mb": _flat([w["rss_mb"] for w in windows]),
        "lag": _flat([float(w["lag"] or 0) for w in windows], floor=float(args.rate)),
    }
    if not getattr(args, "keep", False):
        doc["removed"] = await clean(run)
    return doc


def _with_memory_probe(path: Any) -> None:
    """Workers started from now on load ``bench.memory_probe`` (they inherit our environment)."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    os.environ["BENCH_MEMORY_PROBE"] = str(path)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(here / "worker_probe"), str(here.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    )


#: Stands for the chunk number in a chunk template's event ids and pks (same length as every
#: stamp, no "-": a pk prefix may not hold one).
MARK = "Z000000Z"


def chunk_template(run: Run, events: int) -> list[tuple[EntityKind, bytes, bytes]]:
    """One chunk of the workload, generated once, its ids and pks holding :data:`MARK`.

    Generating each chunk took ~60 % of the publisher's CPU (about 0.7 of a core at 5,000/s), on
    the two cores the worker and the services share: the soak measured the harness as much as the
    worker. Every chunk is now this one with fresh ids and keys (:func:`restamp`)."""
    from dataclasses import replace

    params = replace(run.params, events=events, id_prefix=f"{run.unique}-{MARK}-", pk_prefix=MARK)
    return [(r.kind, r.key, r.value) for r in generate(params).records]


def restamp(template: list[tuple[EntityKind, bytes, bytes]], n: int) -> list[tuple[EntityKind, bytes, bytes]]:
    """Chunk ``n``: the template with :data:`MARK` replaced by ``n`` in every key and value, so its
    event ids and object / link pks are new (the tables keep growing) and its causes still point
    at its own events."""
    old, new = MARK.encode(), f"Z{n:06d}Z".encode()
    return [(kind, key.replace(old, new), value.replace(old, new)) for kind, key, value in template]


async def _windows(
    take: Callable[[int], Awaitable[dict[str, Any]]],
    windows: list[dict[str, Any]],
    started: float,
    duration: float,
    every: float = WINDOW_S,
) -> None:
    """Append a window every ``every`` seconds from ``started`` until ``duration`` has passed."""
    end = started + every
    while end <= started + duration + 1e-9:
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        windows.append(await take(len(windows)))
        print(json.dumps(windows[-1]), flush=True)
        end += every


async def scrape(handles: list[Any]) -> list[str]:
    """The workers' /metrics texts, read in a thread: the event loop publishes meanwhile."""
    texts = []
    for h in handles:
        try:
            texts.append(await asyncio.to_thread(h.metrics_text))
        except Exception:  # noqa: BLE001 - a missed scrape only thins the window
            pass
    return texts


async def _window(
    watch: GroupWatch, sampler: Sampler, handles: list[Any], prev: dict[str, float], index: int
) -> dict[str, Any]:
    texts = await scrape(handles)
    total = measure.counter(texts, "causeway_commit_duration_seconds_sum")
    count = measure.counter(texts, "causeway_commit_duration_seconds_count")
    d_total, d_count = total - prev.get("sum", 0.0), count - prev.get("count", 0.0)
    prev.update(sum=total, count=count)
    rec_total = measure.counter(texts, "causeway_reconciliation_duration_seconds_sum")
    rec_count = measure.counter(texts, "causeway_reconciliation_duration_seconds_count")
    d_rec, d_rec_n = rec_total - prev.get("rec_sum", 0.0), rec_count - prev.get("rec_count", 0.0)
    prev.update(rec_sum=rec_total, rec_count=rec_count)
    progress = await watch.progress()
    cpu, _ = sampler.cpu_now()
    d_cpu = cpu - prev.get("cpu", 0.0)
    prev.update(cpu=cpu)
    # the window's highest sample (every 0.25 s), not the last: a commit's transients are peaks
    since = int(prev.get("rss_samples", 0.0))
    peak = max((rss for _, rss in sampler.rss_series[since:]), default=0)
    prev.update(rss_samples=float(len(sampler.rss_series)))
    return {
        "window": index,
        "commits": int(d_count),
        "commit_mean_s": round(d_total / d_count, 4) if d_count else None,
        # reconciliation passes (one per world) that ended in the window and their wall seconds in the child
        "reconciled_worlds": int(d_rec_n),
        "reconcile_s": round(d_rec, 2),
        "rss_mb": round((sampler.rss_series[-1][1] if sampler.rss_series else 0) / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1),
        "lag": progress.lag,
        # the workers' CPU in the window (children counted once they exit) and the box's load:
        # on a shared box commits per window follow the load, CPU per commit much less
        "worker_cpu_s": round(d_cpu, 2),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def soak_main(args: argparse.Namespace) -> int:
    doc = asyncio.run(soak(args))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"soak-{doc['run']['id']}.json"
    path.write_text(json.dumps(doc, indent=2, default=str))
    verdicts = ("commit_mean_s", "rss_mb", "lag")
    print(json.dumps({k: doc[k] for k in verdicts}, indent=2))
    print(f"results: {path}")
    return 0 if all(doc[k]["verdict"] != "growing" for k in verdicts) else 1
