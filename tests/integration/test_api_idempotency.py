"""The idempotent executor against the real Redis: fencing, leases, stored outcomes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import grpc
import pytest
import redis.asyncio as aioredis

from api.errors import InFlight, KeyReused, NotFound
from api.idempotency import IdempotentExecutor

pytestmark = pytest.mark.integration


@pytest.fixture
async def executor(redis_url: str, unique: str) -> AsyncIterator[IdempotentExecutor]:
    r = aioredis.Redis.from_url(redis_url)
    yield IdempotentExecutor(r, f"causeway:api-test-{unique}", ttl_s=60, lease_s=0.3, wait_s=5.0)
    keys = [k async for k in r.scan_iter(f"causeway:api-test-{unique}:*", count=10_000)]
    if keys:
        await r.delete(*keys)
    await r.aclose()


async def test_a_holder_past_its_lease_cannot_overwrite_its_successor(
    executor: IdempotentExecutor, redis_url: str
) -> None:
    """A stalls (its loop blocked, so no renewal) past the lease; B takes over and stores; A's store is fenced off."""
    b_answer: list[object] = []

    def successor() -> None:
        async def run() -> None:
            r = aioredis.Redis.from_url(redis_url)
            other = IdempotentExecutor(r, executor.prefix, ttl_s=60, lease_s=0.3, wait_s=5.0)

            async def act_b() -> bytes:
                return b"B"

            b_answer.append(await other.run("who", "key", "fp", act_b))
            await r.aclose()

        asyncio.run(run())

    async def act_a() -> bytes:
        thread = threading.Thread(target=successor)
        thread.start()
        time.sleep(1.5)  # noqa: ASYNC251 - on purpose: A stalls, its lease is not renewed and expires
        thread.join()
        return b"A"

    a = await executor.run("who", "key", "fp", act_a)
    assert a.response == b"A" and not a.replayed  # A's caller gets A's own outcome...
    assert b_answer and b_answer[0].response == b"B"  # type: ignore[attr-defined]
    stored = await executor.stored("who", "key")
    assert stored is not None and stored[1].response == b"B"  # ...but the store keeps B's: A was fenced off
    again = await executor.run("who", "key", "fp", act_a)
    assert again.replayed and again.response == b"B"


async def test_outcomes_definitive_failures_are_stored_transient_ones_are_not(executor: IdempotentExecutor) -> None:
    calls = 0

    async def missing() -> bytes:
        nonlocal calls
        calls += 1
        raise NotFound("world 'x' does not exist")

    first = await executor.run("who", "k1", "fp", missing)
    second = await executor.run("who", "k1", "fp", missing)
    assert (first.code, second.code, second.replayed, calls) == (grpc.StatusCode.NOT_FOUND,) * 2 + (True, 1)

    async def flaky() -> bytes:
        nonlocal calls
        calls += 1
        raise ConnectionError("redis hiccup")

    calls = 0
    assert (await executor.run("who", "k2", "fp", flaky)).code == grpc.StatusCode.INTERNAL
    assert (await executor.run("who", "k2", "fp", flaky)).code == grpc.StatusCode.INTERNAL
    assert calls == 2  # not stored: each retry ran again
    with pytest.raises(KeyReused):
        await executor.run("who", "k1", "other-fp", missing)


async def test_a_concurrent_caller_waits_then_gets_in_flight(executor: IdempotentExecutor) -> None:
    executor.wait_s = 0.5
    started = asyncio.Event()

    async def slow() -> bytes:
        started.set()
        await asyncio.sleep(2.0)
        return b"done"

    holder = asyncio.create_task(executor.run("who", "k", "fp", slow))
    await started.wait()
    with pytest.raises(InFlight):
        await executor.run("who", "k", "fp", slow)
    with pytest.raises(KeyReused):
        await executor.run("who", "k", "fp-other", slow)
    assert (await holder).response == b"done"


async def test_a_result_stored_between_a_callers_look_and_its_lock_is_returned_not_run_again(
    executor: IdempotentExecutor, redis_url: str
) -> None:
    """B looks for a stored result (none yet); A finishes, stores and releases the lock; B then takes
    the lock. Before, B ran the action a second time (seen in CI as two different answers to one
    MergeWorld key: "merged", then "nothing-to-merge"); now B answers with A's stored outcome."""
    r = aioredis.Redis.from_url(redis_url)
    other = IdempotentExecutor(r, executor.prefix, ttl_s=60, lease_s=0.3, wait_s=5.0)
    runs: list[str] = []

    async def act(name: str) -> bytes:
        runs.append(name)
        return name.encode()

    looked = executor._answer  # noqa: SLF001
    first = True

    async def look_then_a_finishes(result_key: str, fp: str) -> object:
        nonlocal first
        found = await looked(result_key, fp)
        if first:
            first = False
            assert found is None
            await other.run("who", "race", "fp", lambda: act("A"))  # A runs, stores, releases
        return found

    executor._answer = look_then_a_finishes  # type: ignore[method-assign]  # noqa: SLF001
    try:
        b = await executor.run("who", "race", "fp", lambda: act("B"))
    finally:
        await r.aclose()
    assert runs == ["A"], runs
    assert b.replayed and b.response == b"A"
