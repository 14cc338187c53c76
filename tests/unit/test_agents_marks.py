"""The marks' Redis connections pack a command in one pass, byte for byte as redis-py does; scripts are hashed once."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from agents import marks
from agents.marks import _packing_once, pack_once

ARGS = st.lists(
    st.one_of(st.text(), st.binary(), st.integers(-(2**70), 2**70), st.just("é" * 7000), st.just(b"\x00" * 9000)),
    max_size=20,
)


def _packed(conn: Any, *args: Any) -> bytes:
    return b"".join(bytes(part) for part in conn.pack_command(*args))


@given(ARGS, st.sampled_from(["EVALSHA", "SET", "ping"]))
def test_one_pass_packing_sends_the_bytes_redis_py_sends(args: list[Any], command: str) -> None:
    plain, once = Connection(), _packing_once(Connection)()
    assert _packed(once, command, *args) == _packed(plain, command, *args)


def test_anything_unusual_is_left_to_redis_py() -> None:
    plain, once = Connection(), _packing_once(Connection)()
    for cmd in (("CONFIG GET", "maxmemory"), (b"GET", "k"), ("SET", "k", 1.5), ("SET", "k", memoryview(b"v"))):
        assert _packed(once, *cmd) == _packed(plain, *cmd)
    with pytest.raises(DataError):
        once.pack_command("SET", "k", True)


def test_the_pools_own_connection_class_stays_underneath() -> None:
    for url, base in (
        ("redis://127.0.0.1:1/0", Connection),
        ("rediss://127.0.0.1:1/0", SSLConnection),
        ("unix:///tmp/none.sock", UnixDomainSocketConnection),
    ):
        client = pack_once(aioredis.Redis.from_url(url))
        cls = client.connection_pool.connection_class
        assert issubclass(cls, base) and cls.__name__ == f"PackOnce{base.__name__}"
        assert pack_once(client).connection_pool.connection_class is cls  # idempotent


async def test_a_scripts_digest_is_computed_once_not_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[bytes] = []
    real = marks.hashlib.sha1

    def counting(data: bytes) -> Any:
        hashed.append(data)
        return real(data)

    monkeypatch.setattr(marks.hashlib, "sha1", counting)

    class Client:
        async def script_load(self, script: str) -> str:
            return marks._sha(script)

        async def evalsha(self, sha: str, n: int, *args: Any) -> int:
            return n

    client = Client()
    script = "return #KEYS -- test_a_scripts_digest_is_computed_once"
    for _ in range(3):
        assert await marks.run_scripts(client, script, [(["k1", "k2"], [])]) == [2]  # type: ignore[arg-type]
    assert hashed == [script.encode()]
