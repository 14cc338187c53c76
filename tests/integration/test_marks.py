"""Applied-event marks against the real Redis: server-side scripts, hash-tagged keys, legacy reads."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from agents.dedupe import applied_key, legacy_applied_key
from agents.marks import AppliedMarks

pytestmark = pytest.mark.integration


async def test_mark_then_lookup_in_one_script_per_world(redis_url: str, unique: str) -> None:
    marks = AppliedMarks.from_url(redis_url, 120)
    client = aioredis.Redis.from_url(redis_url)
    w1, w2 = f"a{unique[:10]}", f"b{unique[:10]}"
    try:
        pairs = [(w1, f"e{i}") for i in range(12_000)] + [(w2, "x"), (w2, "y"), (w1, "e0")]
        assert await marks.mark(pairs) == 12_002  # unique pairs; chunked over several script calls
        key = applied_key(w1, "e11999")
        assert await client.get(key) == b"1"
        assert 0 < await client.ttl(key) <= 120
        asked = [(w1, "e5"), (w1, "e11999"), (w1, "missing"), (w2, "y"), (w2, "e5"), (w1, "e5")]
        assert await marks.applied(asked) == {(w1, "e5"), (w1, "e11999"), (w2, "y")}
        assert await marks.applied([]) == set() and await marks.mark([]) == 0
    finally:
        await client.delete(*[applied_key(w, e) for w, e in pairs])
        await client.aclose()
        await marks.close()


async def test_marks_of_the_old_key_format_are_read_until_they_expire(redis_url: str, unique: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    world = f"l{unique[:10]}"
    old = legacy_applied_key(world, "old-1")
    await client.set(old, b"1", ex=60)
    try:
        reading = AppliedMarks(client, 60)
        assert await reading.applied([(world, "old-1"), (world, "new-1")]) == {(world, "old-1")}
        not_reading = AppliedMarks(client, 60, read_legacy=False)
        assert await not_reading.applied([(world, "old-1")]) == set()
        # New marks are written in the hash-tagged format only.
        await reading.mark([(world, "new-1")])
        assert await client.exists(applied_key(world, "new-1")) == 1
        assert await client.exists(legacy_applied_key(world, "new-1")) == 0
        assert await not_reading.applied([(world, "new-1")]) == {(world, "new-1")}
    finally:
        await client.delete(old, applied_key(world, "new-1"))
        await client.aclose()


def test_one_worlds_keys_share_a_cluster_slot() -> None:
    slots = {key_slot(applied_key("w-7", f"event-{i}").encode()) for i in range(1000)}
    assert len(slots) == 1
    legacy = {key_slot(legacy_applied_key("w-7", f"event-{i}").encode()) for i in range(1000)}
    assert len(legacy) > 1  # why the old format cannot be read by one script on a cluster
