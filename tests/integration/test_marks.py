"""Applied-event marks against the real Redis: server-side scripts, the bounded window, compact
buckets, one cluster slot per world, and the old key formats read until they expire."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from agents.dedupe import applied_key, legacy_applied_key
from agents.dedupe_window import SLOTS_PER_WINDOW
from agents.letter_marks import CONFIRMED, arrival_keys, dead_key, pending, world_lookups
from agents.marks import (
    OLD_FORMATS_ABSENT_KEY,
    AppliedMarks,
    DeadLetterMarks,
    old_format_marks_exist,
    pack_once,
    run_scripts,
)
from agents.offset_tracker import Arrival
from models.events import ChangeType, EntityKind, new_event
from sinks.committed_offsets import Source

pytestmark = pytest.mark.integration

#: A ``ChangeEvent``'s fields after its id and world (``new_event``): an object CREATE.
_EVENT_REST = (EntityKind.OBJECT, "T", "p", ChangeType.CREATE, 1, None, {}, None, None, 0, 0, "", None, None, ())


class Clock:
    """A wall clock the test moves (it starts at the real time: keys expire at real Unix times)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def _drop(client: aioredis.Redis, marks: AppliedMarks, worlds: list[str], *extra: str) -> None:
    keys = [k for w in worlds for k in marks.keys_of(w)] + list(extra)
    for i in range(0, len(keys), 5000):
        await client.unlink(*keys[i : i + 5000])


async def test_mark_then_lookup_in_one_script_per_world(redis_url: str, unique: str) -> None:
    marks = AppliedMarks.from_url(redis_url, 120, buckets=16)
    client = aioredis.Redis.from_url(redis_url)
    w1, w2 = f"a{unique[:10]}", f"b{unique[:10]}"
    uuids = [str(uuid.uuid4()) for _ in range(50)]
    cdc = [f"cdc-{uuid.uuid4().hex}" for _ in range(50)]
    try:
        pairs = [(w1, f"e{i}") for i in range(12_000)] + [(w2, "x"), (w2, "y"), (w1, "e0")]
        pairs += [(w1, u) for u in uuids] + [(w2, c) for c in cdc]
        assert await marks.mark(pairs) == 12_102  # unique pairs; chunked over several script calls
        assert await marks.mark(pairs[:100]) == 100  # idempotent: packed records are not appended twice
        asked = [(w1, "e5"), (w1, "e11999"), (w1, "missing"), (w2, "y"), (w2, "e5"), (w1, "e5")]
        asked += [(w1, uuids[7]), (w2, uuids[7]), (w2, cdc[3]), (w2, f"cdc-{uuid.uuid4().hex}")]
        assert await marks.applied(asked) == {(w1, "e5"), (w1, "e11999"), (w2, "y"), (w1, uuids[7]), (w2, cdc[3])}
        assert await marks.applied([]) == set() and await marks.mark([]) == 0
        # Compact: a world's marks are in at most 3 families x 16 buckets of the current slot, not a key each.
        live = [k for k in marks.keys_of(w1) if await client.exists(k)]
        assert 0 < len(live) <= 3 * 16
        ttl = await client.ttl(live[0])
        assert 120 <= ttl <= 120 + 120 // SLOTS_PER_WINDOW + 1
        assert await client.exists(applied_key(w1, "e5")) == 0  # no per-event key any more
    finally:
        await _drop(client, marks, [w1, w2])
        await client.aclose()
        await marks.close()


async def test_a_packed_record_is_matched_only_on_its_own_16_bytes(redis_url: str, unique: str) -> None:
    """Two packed ids side by side contain, across their boundary, 16 bytes that are a third id."""
    clock = Clock()
    marks = AppliedMarks.from_url(redis_url, 600, buckets=1, clock=clock)
    client = aioredis.Redis.from_url(redis_url)
    world = f"p{unique[:10]}"
    a, b = "11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-aaaaaaaaaaaa"
    straddling = "22223333-4444-5555-5555-666666667777"  # the last 8 bytes of a + the first 8 of b
    try:
        await marks.mark([(world, a), (world, b)])
        assert await marks.applied([(world, a), (world, b), (world, straddling)]) == {(world, a), (world, b)}
    finally:
        await _drop(client, marks, [world])
        await client.aclose()
        await marks.close()


async def test_marks_live_for_the_window_then_go_and_memory_stays_flat(redis_url: str, unique: str) -> None:
    clock = Clock()
    start = clock.now
    marks = AppliedMarks.from_url(redis_url, 400, buckets=4, clock=clock)
    client = aioredis.Redis.from_url(redis_url)
    world = f"t{unique[:10]}"
    ids = [str(uuid.uuid4()) for _ in range(20)]
    try:
        await marks.mark([(world, i) for i in ids[:10]])
        clock.now += 399  # just inside the window: still marked, whatever the slot
        assert await marks.applied([(world, i) for i in ids[:10]]) == {(world, i) for i in ids[:10]}
        await marks.mark([(world, i) for i in ids[10:]])
        clock.now += 400 + 200 + 1  # past the window and a slot: the first marks are out of the lookup
        assert await marks.applied([(world, i) for i in ids[:10]]) == set()
        # Their keys carry an expiry at the slot's end plus the window: Redis drops them by itself.
        first_slot = marks.window.slot(start)
        assert marks.window.expire_at(first_slot) <= start + 400 + 200
    finally:
        await _drop(client, marks, [world])
        await client.aclose()
        await marks.close()


async def test_marks_of_the_old_key_formats_are_read_until_they_expire(redis_url: str, unique: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    world = f"l{unique[:10]}"
    old, tagged = legacy_applied_key(world, "old-1"), applied_key(world, "old-2")
    await client.set(old, b"1", ex=60)
    await client.set(tagged, b"1", ex=60)
    reading = AppliedMarks(client, 60, old_formats_recheck_s=0)  # no scan: another test's could skip them
    try:
        both = {(world, "old-1"), (world, "old-2")}
        assert await reading.applied([(world, "old-1"), (world, "old-2"), (world, "new-1")]) == both
        not_legacy = AppliedMarks(client, 60, read_legacy=False, old_formats_recheck_s=0)
        assert await not_legacy.applied([(world, "old-1"), (world, "old-2")]) == {(world, "old-2")}
        neither = AppliedMarks(client, 60, read_legacy=False, read_per_event=False)
        assert await neither.applied([(world, "old-1"), (world, "old-2")]) == set()
        # New marks are written in the windowed format only.
        await reading.mark([(world, "new-1")])
        assert await client.exists(applied_key(world, "new-1"), legacy_applied_key(world, "new-1")) == 0
        assert await neither.applied([(world, "new-1")]) == {(world, "new-1")}
        # forget() removes a mark in any format (tests and repairs that simulate a lost mark).
        packed = [str(uuid.uuid4()) for _ in range(3)]
        await reading.mark([(world, p) for p in packed])
        assert await reading.forget([(world, "new-1"), (world, "old-2"), (world, packed[1])]) == 3
        assert await reading.applied([(world, "new-1"), (world, "old-2"), *((world, p) for p in packed)]) == {
            (world, packed[0]),
            (world, packed[2]),
        }
    finally:
        await _drop(client, reading, [world], old, tagged)
        await client.aclose()


def _recording(redis_url: str) -> tuple[aioredis.Redis, list[tuple[Any, ...]]]:
    """A client as the marks make it (``pack_once``) that records every command it sends."""
    sent: list[tuple[Any, ...]] = []
    client = pack_once(aioredis.Redis.from_url(redis_url))
    base = client.connection_pool.connection_class

    class Recording(base):  # type: ignore[misc, valid-type]
        def pack_command(self, *args: Any) -> list[bytes]:
            sent.append(args)
            return super().pack_command(*args)

    client.connection_pool.connection_class = Recording
    return client, sent


async def test_a_clients_first_script_call_loads_the_script_instead_of_failing(redis_url: str, unique: str) -> None:
    """No call fails with NOSCRIPT on the way: redis-py formats every argument of a failed pipeline
    command into its error message, and a batch's call has thousands (~0.5 s of CPU)."""
    client, sent = _recording(redis_url)
    script = f"return #KEYS -- never loaded before: {unique}"
    try:
        assert await run_scripts(client, script, [([f"{{{unique}}}a", f"{{{unique}}}b"], [])]) == [2]
        assert await run_scripts(client, script, [([f"{{{unique}}}a"], [])]) == [1]
        assert [args[0] for args in sent if args[0] in ("EVALSHA", "SCRIPT LOAD")] == [
            "SCRIPT LOAD",
            "EVALSHA",
            "EVALSHA",
        ]
    finally:
        await client.aclose()


async def test_a_single_script_call_is_sent_alone_and_several_in_one_pipeline(redis_url: str, unique: str) -> None:
    """A world's marks after its commit are one script call: redis-py's pipeline of one costs ~1.5x
    the CPU of the call sent alone (the flush's event-loop work at 100 worlds)."""
    client, sent = _recording(redis_url)
    pipelines = []
    make_pipeline = client.pipeline
    client.pipeline = lambda *a, **kw: pipelines.append(kw) or make_pipeline(*a, **kw)  # type: ignore[method-assign]
    script = f"return #KEYS -- {unique}"
    keys = [f"{{{unique}}}a", f"{{{unique}}}b"]
    try:
        assert await run_scripts(client, script, [(keys, [])]) == [2]
        assert pipelines == []
        assert await run_scripts(client, script, [(keys, []), (keys[:1], [])]) == [2, 1]
        assert pipelines == [{"transaction": False}]
        assert [args[0] for args in sent if args[0] == "EVALSHA"] == ["EVALSHA"] * 3
    finally:
        await client.aclose()


async def test_the_old_formats_are_read_in_the_lookups_script_call_without_a_key_per_id(
    redis_url: str, unique: str
) -> None:
    """While both migration switches are on, a lookup still finds marks of both old formats (text
    and UUID ids), and its one script call per world carries a handful of arguments, not two keys
    per id (packed, sent and parsed for every event of a poll)."""
    client, sent = _recording(redis_url)
    world = f"o{unique[:10]}"
    uid = str(uuid.uuid4())
    ids = [f"id-{i}" for i in range(2_000)] + [uid]
    old = [legacy_applied_key(world, "id-7"), applied_key(world, uid), applied_key(world, "id-1999")]
    for key in old:
        await client.set(key, b"1", ex=60)
    marks = AppliedMarks(client, 60, buckets=4, old_formats_recheck_s=0)
    await marks.mark([(world, "id-3")])
    try:
        sent.clear()
        found = await marks.applied([(world, i) for i in ids])
        assert found == {(world, "id-7"), (world, uid), (world, "id-1999"), (world, "id-3")}
        calls = [args for args in sent if args[0] == "EVALSHA"]
        assert calls and all(len(c) < 50 for c in calls)  # 4 buckets x 3 slots; before: 2 keys more per id
    finally:
        await _drop(client, marks, [world], *old)
        await client.aclose()


def test_one_worlds_keys_share_a_cluster_slot() -> None:
    marks = AppliedMarks(aioredis.Redis(), 3600, buckets=64)
    keys = marks.keys_of("w-7", now=1e9) + [applied_key("w-7", f"event-{i}") for i in range(1000)]
    assert len({key_slot(k.encode()) for k in keys}) == 1
    legacy = {key_slot(legacy_applied_key("w-7", f"event-{i}").encode()) for i in range(1000)}
    assert len(legacy) > 1  # why the oldest format cannot be read by one script on a cluster


async def test_redis_drops_a_slot_once_the_window_has_passed_it(redis_url: str, unique: str) -> None:
    """Memory stays flat: the keys themselves expire (real time, a 2-second window)."""
    marks = AppliedMarks.from_url(redis_url, 2, buckets=2)
    client = aioredis.Redis.from_url(redis_url)
    world = f"x{unique[:10]}"
    try:
        written_at = time.time()
        await marks.mark([(world, str(uuid.uuid4())) for _ in range(20)] + [(world, "plain-id")])
        keys = marks.keys_of(world, written_at)
        assert await client.exists(*keys) > 0
        deadline = marks.window.expire_at(marks.window.slot(written_at))
        await asyncio.sleep(max(0.0, deadline + 1.5 - time.time()))  # Redis expires keys on time
        assert await client.exists(*keys) == 0
    finally:
        await _drop(client, marks, [world])
        await client.aclose()
        await marks.close()


async def test_ids_of_every_shape_share_a_bucket_and_are_found_exactly(redis_url: str, unique: str) -> None:
    """A bucket's ids travel as one blob (16-byte records, or NUL-separated text): ids that are
    prefixes of each other, hold separators, spaces, control or non-ASCII characters, or look like
    UUIDs without being canonical, all come back exactly, and only those marked."""
    clock = Clock()
    marks = AppliedMarks.from_url(redis_url, 600, buckets=1, clock=clock)
    client = aioredis.Redis.from_url(redis_url)
    world = f"s{unique[:10]}"
    u = str(uuid.uuid4())
    odd = ["a", "ab", "a b", "a:b", "{x}", "é-ü-✓", "tab\there", "\x01", "x" * 200, u.upper(), u, f"cdc-{'0' * 32}"]
    unmarked = ["abc", "b", "a:", " a", u.upper() + "0", str(uuid.uuid4()), f"cdc-{'1' * 32}"]
    try:
        assert await marks.mark([(world, i) for i in odd]) == len(odd)
        found = await marks.applied([(world, i) for i in odd + unmarked])
        assert found == {(world, i) for i in odd}
        with pytest.raises(ValueError, match="NUL"):
            await marks.mark([(world, "a\x00b"), (world, "c")])
    finally:
        await _drop(client, marks, [world])
        await client.aclose()
        await marks.close()


async def test_the_decisions_of_decoded_records_are_read_per_world_from_their_parts(
    redis_url: str, unique: str
) -> None:
    """``DeadLetterMarks.states`` with the records' keys per world (``WorldLookup``) finds the same
    decisions as the keys one by one (an origin's, an event's under its redrive count, confirmed
    or pending, and a bad record's by its partition) in one round trip whose calls carry a handful
    of arguments each, not two keys a record. All the keys are in the world's cluster slot."""
    client, sent = _recording(redis_url)
    topic, world = f"t{unique[:10]}", f"d{unique[:10]}"
    arrivals = [Arrival(new_event(f"e{i}", world, *_EVENT_REST), Source(topic, i % 2, 100 + i)) for i in range(3_000)]
    redrives = {(topic, 1, 107): 1}
    looks = world_lookups(arrivals, redrives)
    bad = dead_key((topic, 0, 5_000), None)
    decided = {
        arrival_keys(arrivals[3])[0]: CONFIRMED,
        arrival_keys(arrivals[7], 1)[1]: pending(123),
        arrival_keys(arrivals[2_999])[1]: CONFIRMED,
        bad: CONFIRMED,
    }
    other = arrival_keys(arrivals[8], 1)[1]  # event 8 has no redrive: its redrive-1 key is not read
    dead = DeadLetterMarks(client, 60)
    try:
        await dead.record([k for k, v in decided.items() if v == CONFIRMED])
        await dead.record([arrival_keys(arrivals[7], 1)[1]], pending(123))
        await dead.record([other])
        sent.clear()
        assert await dead.states([bad], looks) == decided
        assert await dead.states([], looks) == {k: v for k, v in decided.items() if k != bad}
        calls = [args for args in sent if args[0] == "EVALSHA"]
        assert calls and all(len(c) < 10 for c in calls)
        assert len({key_slot(k.encode()) for k in looks[world].keys()}) == 1
    finally:
        await client.unlink(*decided, other)
        await client.aclose()


async def _command_calls(client: aioredis.Redis) -> dict[str, int]:
    stats = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def test_a_batch_costs_redis_one_command_a_bucket_and_span_not_one_an_id(redis_url: str, unique: str) -> None:
    """Each ``redis.call`` in a script costs the server ~1.5 µs beyond its command: a lookup of
    10,000 fresh ids took 45 ms of Redis time with a call per id and slot (and two per id for the old
    formats), 21 ms with one per bucket. The counts are server-wide, so other tests running at the
    same time can only add a few; a call per id would add thousands."""
    client = aioredis.Redis.from_url(redis_url)
    world = f"c{unique[:10]}"
    ids = [f"id-{i}" for i in range(3_000)]
    old = [legacy_applied_key(world, "id-7"), applied_key(world, "id-2999")]
    for key in old:
        await client.set(key, b"1", ex=60)
    marks = AppliedMarks(client, 60, buckets=1, old_formats_recheck_s=0)
    dead = DeadLetterMarks.from_url(redis_url, 60)
    arrivals = [Arrival(new_event(i, world, *_EVENT_REST), Source("t", 0, n)) for n, i in enumerate(ids)]
    try:
        before = await _command_calls(client)
        assert await marks.mark([(world, i) for i in ids[:1_500]]) == 1_500
        found = await marks.applied([(world, i) for i in ids])
        assert found == {(world, i) for i in ids[:1_500]} | {(world, "id-2999")}
        assert await dead.states([], world_lookups(arrivals)) == {}
        after = await _command_calls(client)
        calls = {name: after.get(name, 0) - before.get(name, 0) for name in ("hset", "hexists", "exists", "get")}
        # Before: 1,500 HSETs, 4,500 HEXISTS (3 slots), 3,000 EXISTS (1,500 fresh ids x 2 formats), 6,000 GETs.
        assert all(n < 500 for n in calls.values()), calls
    finally:
        await _drop(client, marks, [world], *old)
        await dead.close()
        await client.aclose()


async def test_old_format_marks_are_read_only_while_a_scan_finds_any(redis_url: str, unique: str) -> None:
    """On a Redis of its own (database 14): no old-format key, so the lookups stop reading the old
    formats once the scan says so; one written later is read again after the next scan."""
    url = redis_url.rsplit("/", 1)[0] + "/14"
    client = aioredis.Redis.from_url(url)
    await client.flushdb()
    clock = Clock()
    world = f"s{unique[:10]}"
    marks = AppliedMarks(client, 60, clock=clock, old_formats_recheck_s=30)
    try:
        assert not await old_format_marks_exist(client)
        assert await marks.applied([(world, "a")]) == set()  # starts the first scan
        for _ in range(100):
            if not marks.old_formats_seen:
                break
            await asyncio.sleep(0.01)
        assert marks.old_formats_seen is False
        await client.set(applied_key(world, "late"), b"1", ex=60)  # a worker of the old version
        assert await marks.applied([(world, "late")]) == set()  # not read until the next scan
        clock.now += 31
        # The next scan, and another worker's first, take the first scan's word while it lasts ...
        assert await client.ttl(OLD_FORMATS_ABSENT_KEY) == 30
        other = AppliedMarks(client, 60, clock=clock)
        await other.applied([(world, "late")])
        clock.now += 31
        await marks.applied([(world, "late")])
        await asyncio.sleep(0.05)
        assert marks.old_formats_seen is False and other.old_formats_seen is False
        # ... and scan again once it is gone.
        await client.delete(OLD_FORMATS_ABSENT_KEY)
        clock.now += 31
        await marks.applied([(world, "late")])  # starts the next scan
        for _ in range(100):
            if marks.old_formats_seen:
                break
            await asyncio.sleep(0.01)
        assert await marks.applied([(world, "late")]) == {(world, "late")}
    finally:
        await client.flushdb()
        await client.aclose()


async def test_a_scan_that_fails_keeps_the_old_formats_read(redis_url: str, unique: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    world = f"f{unique[:10]}"
    await client.set(applied_key(world, "old"), b"1", ex=60)
    marks = AppliedMarks(client, 60)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("scan refused")

    client.scan = broken  # type: ignore[method-assign]
    absent = await client.get(OLD_FORMATS_ABSENT_KEY)
    await client.delete(OLD_FORMATS_ABSENT_KEY)  # another test's scan may have found none
    try:
        for _ in range(3):
            assert await marks.applied([(world, "old")]) == {(world, "old")}
            await asyncio.sleep(0.01)
        assert marks.old_formats_seen is True
    finally:
        await client.delete(applied_key(world, "old"))
        if absent:
            await client.set(OLD_FORMATS_ABSENT_KEY, absent, ex=60)
        await client.aclose()


async def test_closing_the_marks_ends_a_scan_in_flight_without_a_warning(
    redis_url: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A short-lived command (replay, redrive) closes its marks while the first scan may still be
    walking the keyspace: the scan ends with them, it does not fail on a closed client. On a Redis
    of its own (database 13): no other test's shared scan result may stand in for the scan."""
    client = aioredis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/13")
    await client.flushdb()
    entered, held = asyncio.Event(), asyncio.Event()

    async def slow_scan(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        await held.wait()
        return 0, []

    client.scan = slow_scan  # type: ignore[method-assign]
    marks = AppliedMarks(client, 60)
    await marks.applied([(f"c{unique[:10]}", "e1")])
    await asyncio.wait_for(entered.wait(), 10)
    scan = marks._old_scan  # noqa: SLF001 - the task this test is about
    assert scan is not None and not scan.done()
    await asyncio.wait_for(marks.close(), 10)
    assert scan.cancelled()
    assert "could not scan" not in caplog.text
