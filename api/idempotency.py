"""Idempotent actions: one effect per idempotency key, with a Redis lock, a fencing token and a lease.

``run(key, fingerprint, action)``:

1. A stored outcome under the key answers at once (same fingerprint) or refuses the call
   (another request used the key: ``KeyReused``).
2. Otherwise take the lock ``SET NX PX lease`` holding ``<fence>|<fingerprint>``; the fence is a
   strictly increasing number (``INCR``). While the action runs, the lease is renewed only if the
   lock still holds our fence.
3. The outcome is stored by a script that checks the lock still holds our fence, so a holder
   whose lease expired (paused, partitioned) can never overwrite the outcome of the caller that
   took over. Transient failures (UNAVAILABLE, INTERNAL) are not stored: a retry runs again.
4. A caller that finds the lock taken polls for the outcome up to ``wait_s``, then gets ``InFlight``.

A holder that crashes leaves the lock until its lease expires; the next caller then runs the action
again. That is safe because every action is itself guarded (create-if-absent, tag-if-absent,
delete with an expected hash, rollback planned against the current head): running it a second
time finds the effect already there and reports it, it never applies it twice.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import orjson
import redis.asyncio as aioredis

from agents import faults
from api.errors import DEFINITIVE, ApiError, InFlight, KeyReused, status_for

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_STORE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
redis.call('DEL', KEYS[1])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Outcome:
    """An action's outcome as stored: a gRPC code, a message, and the serialized response on OK
    (on a failure: the serialized ``google.rpc.Status`` details, if the error carried any)."""

    code: grpc.StatusCode
    message: str
    response: bytes = b""
    replayed: bool = False  # answered from the store, not by running the action

    def dump(self, fingerprint: str, fence: int) -> bytes:
        return orjson.dumps(
            {
                "fp": fingerprint,
                "fence": fence,
                "code": self.code.name,
                "msg": self.message,
                "resp": self.response.hex(),
            }
        )

    @classmethod
    def load(cls, raw: bytes | str) -> tuple[str, Outcome]:
        d = orjson.loads(raw)
        return d["fp"], cls(grpc.StatusCode[d["code"]], d["msg"], bytes.fromhex(d["resp"]), replayed=True)


def fingerprint(method: str, request_bytes: bytes) -> str:
    """What a key is bound to: the method and the request (serialized deterministically, key cleared)."""
    return hashlib.sha256(method.encode() + b"\0" + request_bytes).hexdigest()


class IdempotentExecutor:
    def __init__(
        self, redis: aioredis.Redis, prefix: str, *, ttl_s: int, lease_s: float, wait_s: float, poll_s: float = 0.05
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.lease_ms = max(100, int(lease_s * 1000))
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.runs = 0  # actions this process ran (the load test reads it through the stored fences)

    def _keys(self, scope: str, key: str) -> tuple[str, str]:
        base = f"{self.prefix}:idem:{scope}:{key}"
        return base + ":lock", base + ":result"

    async def stored(self, scope: str, key: str) -> tuple[str, Outcome] | None:
        raw = await self.redis.get(self._keys(scope, key)[1])
        return Outcome.load(raw) if raw else None

    async def run(self, scope: str, key: str, fp: str, action: Callable[[], Awaitable[bytes]]) -> Outcome:
        """Run ``action`` once for ``(scope, key)``; ``action`` returns the serialized response."""
        lock_key, result_key = self._keys(scope, key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while True:
            found = await self._answer(result_key, fp)
            if found is not None:
                return found
            fence = int(await self.redis.incr(f"{self.prefix}:idem:fence"))
            token = f"{fence}|{fp}"
            if await self.redis.set(lock_key, token, nx=True, px=self.lease_ms):
                # Looked again under the lock: a holder may have stored its outcome and released the
                # lock between our first look and our lock (it stores before it releases).
                try:
                    found = await self._answer(result_key, fp)
                except BaseException:
                    await self.redis.eval(_RELEASE, 1, lock_key, token)
                    raise
                if found is not None:
                    await self.redis.eval(_RELEASE, 1, lock_key, token)
                    return found
                return await self._hold(lock_key, result_key, token, fp, fence, action)
            holder = await self.redis.get(lock_key)
            if holder is not None and _text(holder).partition("|")[2] != fp:
                raise KeyReused(f"idempotency key {key!r} is in flight for a different request")
            if loop.time() >= deadline:
                raise InFlight(f"idempotency key {key!r} is in flight in another call; retry with the same key")
            await asyncio.sleep(self.poll_s)

    async def _answer(self, result_key: str, fp: str) -> Outcome | None:
        raw = await self.redis.get(result_key)
        if raw is None:
            return None
        stored_fp, outcome = Outcome.load(raw)
        if stored_fp != fp:
            raise KeyReused("idempotency key already used for a different request; use a new key")
        return outcome

    async def _hold(
        self, lock_key: str, result_key: str, token: str, fp: str, fence: int, action: Callable[[], Awaitable[bytes]]
    ) -> Outcome:
        renew = asyncio.create_task(self._renew(lock_key, token))
        try:
            self.runs += 1
            try:
                outcome = Outcome(grpc.StatusCode.OK, "", await action())
            except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                code, message = status_for(exc)
                outcome = Outcome(code, message, exc.status_details if isinstance(exc, ApiError) else b"")
            faults.reached("api-after-action")  # fault tests: the effect landed, the outcome is not stored
            if outcome.code in DEFINITIVE:
                await self.redis.eval(_STORE, 2, lock_key, result_key, token, outcome.dump(fp, fence), self.ttl_s)
            return outcome
        finally:
            renew.cancel()
            await self.redis.eval(_RELEASE, 1, lock_key, token)

    async def _renew(self, lock_key: str, token: str) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            if not await self.redis.eval(_RENEW, 1, lock_key, token, self.lease_ms):
                return


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
