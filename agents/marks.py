"""Applied-event marks in Redis: one pipelined round trip to ask, one to mark.

A mark ``causeway:applied:<world>:<event_id>`` means "this event took effect on the world's
branch". Marks are written only after the Nessie commit, so a missing mark never hides an
unapplied event; the branch's recorded offsets cover the window between commit and mark.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis

from agents.dedupe import applied_key as mark_key


class AppliedMarks:
    def __init__(self, client: aioredis.Redis, ttl_s: int) -> None:
        self._redis = client
        self._ttl = ttl_s

    @classmethod
    def from_url(cls, url: str, ttl_s: int, **options: Any) -> AppliedMarks:
        """``options``: streams.security.redis_options (password, ACL user, TLS CA)."""
        client = aioredis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, **options)
        return cls(client, ttl_s)

    async def applied(self, pairs: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which (world, event_id) pairs are marked; one pipelined round trip."""
        items = list(dict.fromkeys(pairs))
        if not items:
            return set()
        # One MGET: a single command is several times cheaper for redis-py than N pipelined EXISTS.
        # (On Redis Cluster the keys span slots: a cluster client's mget_nonatomic splits it.)
        answers = await self._redis.mget([mark_key(world, event_id) for world, event_id in items])
        return {item for item, hit in zip(items, answers, strict=True) if hit is not None}

    async def mark(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Mark pairs applied with the TTL; idempotent. Returns how many were written."""
        items = list(dict.fromkeys(pairs))
        if not items:
            return 0
        async with self._redis.pipeline(transaction=False) as pipe:
            for world, event_id in items:
                pipe.set(mark_key(world, event_id), b"1", ex=self._ttl)
            await pipe.execute()
        return len(items)

    async def ping(self) -> bool:
        return bool(await self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()
