"""Redis memory of the applied-event marks: write N marks through the real marks code, measure.

``python -m bench dedupe-memory --marks 10000000`` writes the marks a worker would write at
``--rate`` events/s (the clock moves by batch/rate per batch, so they spread over the window's
slots as in production), through ``agents.marks.AppliedMarks.mark`` against the configured Redis,
under a key prefix of their own; then it reports

* ``bytes_per_mark``: the sum of ``MEMORY USAGE`` over every key the marks created, per mark
  (exact for these keys: other clients of a shared Redis do not blur it);
* ``used_memory_delta_per_mark``: the ``INFO memory`` ``used_memory`` delta per mark (includes
  whatever else the server did meanwhile);
* ``window_bytes``: the formula of docs/architecture.md, rate × (window + window/2) × bytes per mark;

and deletes its keys. Nothing else in Redis is touched. Each call is followed by a pause as long
as the call took, so a shared Redis stays responsive to its other clients (the write rate
reported is therefore about half of what the script sustains).

Bytes per mark depend on how full the buckets are (marks per bucket), not on how many marks there
are: ``--marks 1000000 --buckets 9000`` fills buckets as 10M marks into 90,000 buckets would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from typing import Any

import redis.asyncio as aioredis

from agents.marks import AppliedMarks
from streams.security import redis_options
from streams.settings import Settings

BATCH = 1_000  # ids per mark call: each call holds the (shared) Redis for its duration


def make_ids(shape: str, tag: str, start: int, n: int) -> list[str]:
    if shape == "uuid":
        return [str(uuid.UUID(bytes=os.urandom(16), version=4)) for _ in range(n)]
    if shape == "cdc":
        return ["cdc-" + os.urandom(16).hex() for _ in range(n)]
    return [f"{tag}-ev-7-{i}" for i in range(start, start + n)]  # the benchmark workload's ids


async def _sum_usage(client: aioredis.Redis, match: str) -> tuple[int, int]:
    """(keys, bytes) of every key matching ``match``, by ``MEMORY USAGE … SAMPLES 0``."""
    keys = total = 0
    batch: list[bytes] = []

    async def flush() -> int:
        async with client.pipeline(transaction=False) as pipe:
            for k in batch:
                pipe.memory_usage(k, samples=0)
            return sum(x or 0 for x in await pipe.execute())

    async for key in client.scan_iter(match=match, count=10_000):
        batch.append(key)
        keys += 1
        if len(batch) >= 2_000:
            total += await flush()
            batch.clear()
    if batch:
        total += await flush()
    return keys, total


async def _drop(client: aioredis.Redis, match: str) -> int:
    dropped = 0
    batch: list[bytes] = []
    async for key in client.scan_iter(match=match, count=10_000):
        batch.append(key)
        if len(batch) >= 5_000:
            dropped += int(await client.unlink(*batch))
            batch.clear()
    if batch:
        dropped += int(await client.unlink(*batch))
    return dropped


async def measure(marks_n: int, rate: float, window_s: int, buckets: int | None, shape: str) -> dict[str, Any]:
    settings = Settings.from_env()
    tag = uuid.uuid4().hex[:8]
    prefix = f"bench:{tag}:marks:"
    world = f"bench-{tag}"
    buckets = buckets or max(1, int(rate * window_s / 200))  # ~100 marks per bucket per half window
    now = [time.time()]
    marks = AppliedMarks.from_url(
        settings.redis_url, window_s, buckets=buckets, prefix=prefix, clock=lambda: now[0], **redis_options(settings)
    )
    client = aioredis.Redis.from_url(settings.redis_url, **redis_options(settings))
    match = f"{prefix}*"
    try:
        before = (await client.info("memory"))["used_memory"]
        started = time.monotonic()
        written = 0
        busy = 0.0
        while written < marks_n:
            n = min(BATCH, marks_n - written)
            pairs = [(world, i) for i in make_ids(shape, tag, written, n)]
            t0 = time.monotonic()
            await marks.mark(pairs)
            took = time.monotonic() - t0
            busy += took
            await asyncio.sleep(took)
            written += n
            now[0] += n / rate
        seconds = time.monotonic() - started
        after = (await client.info("memory"))["used_memory"]
        keys, usage = await _sum_usage(client, match)
        per_mark = usage / written
        return {
            "marks": written,
            "id_shape": shape,
            "rate": rate,
            "window_s": window_s,
            "buckets": buckets,
            "keys": keys,
            "memory_usage_bytes": usage,
            "bytes_per_mark": round(per_mark, 2),
            "used_memory_delta_per_mark": round((after - before) / written, 2),
            "window_bytes": round(marks.window.bytes_held(rate, per_mark)),
            "write_seconds": round(seconds, 1),
            "mark_call_seconds": round(busy, 1),
            "marks_per_s_in_calls": round(written / busy) if busy else None,
        }
    finally:
        await _drop(client, match)
        await client.aclose()
        await marks.close()


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "dedupe-memory",
        help="Redis bytes per applied-event mark after N marks (real marks code, real Redis, own key prefix)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  python -m bench dedupe-memory --marks 1000000 --buckets 9000 --ids uuid",
    )
    p.add_argument("--marks", type=int, default=10_000_000)
    p.add_argument("--rate", type=float, default=5_000, help="events/s the marks are spread at (default 5000)")
    p.add_argument("--window", type=int, default=3_600, help="dedupe window, seconds (default 3600)")
    p.add_argument("--buckets", type=int, help="buckets per half window (default rate × window / 200)")
    p.add_argument("--ids", choices=("uuid", "cdc", "bench"), default="uuid", help="event id shape (default uuid)")


def main(args: argparse.Namespace) -> int:
    doc = asyncio.run(measure(args.marks, args.rate, args.window, args.buckets, args.ids))
    print(json.dumps(doc, indent=2))
    return 0
