"""streams/kept_client.py, and the dependency probes behind /health that keep their clients with it:
one client across rounds, a fresh one after a failure, one more try when a kept connection went stale."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from agents import probes
from agents.probes import dependency_watcher
from monitoring.health import Health
from streams.kept_client import KeptClient
from streams.settings import Settings


class Service:
    """A service that is up or down; its clients fail while it is down, and a client from before a
    restart stays broken (its connection was dropped) until closed."""

    def __init__(self) -> None:
        self.up = True
        self.generation = 0  # bumped at each restart
        self.opened: list[Client] = []
        self.closed: list[Client] = []

    def restart(self) -> None:
        self.generation += 1

    async def open(self) -> Client:
        if not self.up:
            raise ConnectionRefusedError("Connection refused")
        client = Client(self)
        self.opened.append(client)
        return client

    async def close(self, client: Client) -> None:
        self.closed.append(client)


class Client:
    def __init__(self, service: Service) -> None:
        self.service, self.generation = service, service.generation

    async def ask(self) -> str:
        if not self.service.up or self.generation != self.service.generation:
            raise ConnectionResetError("Connection reset by peer")
        return "answer"


def _kept(service: Service) -> KeptClient[Client]:
    return KeptClient(service.open, service.close)


async def test_rounds_share_one_client() -> None:
    service = Service()
    kept = _kept(service)
    for _ in range(5):
        assert await kept.call(Client.ask) == "answer"
    assert len(service.opened) == 1 and kept.opened == 1
    await kept.aclose()
    assert service.closed == service.opened


async def test_an_outage_fails_each_round_once_and_the_service_is_found_again() -> None:
    service = Service()
    kept = _kept(service)
    await kept.call(Client.ask)
    service.up = False
    for _ in range(3):
        with pytest.raises(ConnectionError):
            await kept.call(Client.ask)
    # The kept client was closed at the first failure; later rounds fail on opening, once each.
    assert service.closed == service.opened and len(service.opened) == 1
    service.up = True
    assert await kept.call(Client.ask) == "answer"
    assert await kept.call(Client.ask) == "answer"
    assert len(service.opened) == 2


async def test_a_stale_kept_connection_is_not_an_outage() -> None:
    service = Service()
    kept = _kept(service)
    await kept.call(Client.ask)
    service.restart()  # the server dropped the kept connection but answers new ones
    assert await kept.call(Client.ask) == "answer"
    assert len(service.opened) == 2 and service.closed == service.opened[:1]


async def test_a_cancelled_call_drops_its_client() -> None:
    service = Service()
    kept = _kept(service)

    async def hangs(client: Client) -> str:
        await asyncio.sleep(60)
        return "never"

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(kept.call(hangs), 0.05)
    assert service.closed == service.opened
    assert await kept.call(Client.ask) == "answer"
    assert len(service.opened) == 2


class Cluster:
    def brokers(self) -> list[str]:
        return ["b1"]


class Answer:
    """A metadata response: its brokers."""

    brokers = [(1, "127.0.0.1", 9092, None)]


class FakeKafka:
    """Stands in for aiokafka's AIOKafkaClient: bootstrap and metadata fail while the broker is down."""

    broker_up = True
    made: list[FakeKafka] = []

    def __init__(self, **options: Any) -> None:
        FakeKafka.made.append(self)
        self.closed = False
        self.cluster = Cluster()  # what bootstrap() learnt

    async def bootstrap(self) -> None:
        if not FakeKafka.broker_up:
            raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 9092, <AddressFamily.AF_INET: 2>)]")

    def get_random_node(self) -> int:
        return 1

    async def send(self, node_id: int, request: Any) -> Any:
        if not FakeKafka.broker_up or self.closed:
            raise KafkaConnectionError(f"Connection at 127.0.0.1:9092 (node {node_id}) closed")
        return Answer()

    async def close(self) -> None:
        self.closed = True


class FakeRedis:
    server_up = True
    made: list[FakeRedis] = []

    @classmethod
    def from_url(cls, url: str, **options: Any) -> FakeRedis:
        client = cls()
        cls.made.append(client)
        return client

    async def ping(self) -> bool:
        if not FakeRedis.server_up:
            raise ConnectionRefusedError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return True

    async def aclose(self) -> None:
        pass


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiokafka.client
    import redis.asyncio

    FakeKafka.made, FakeKafka.broker_up, FakeRedis.made, FakeRedis.server_up = [], True, [], True
    monkeypatch.setattr(aiokafka.client, "AIOKafkaClient", FakeKafka)
    monkeypatch.setattr(redis.asyncio, "Redis", FakeRedis)


async def test_the_watchers_probes_keep_one_client_each_and_recover_after_an_outage(
    fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed before: every round of the watcher behind /health built (and bootstrapped) a new Kafka
    client and a new Redis client."""

    async def nessie_ok(settings: Settings, timeout_s: float, client: Any = None) -> probes.ProbeResult:
        return probes.ProbeResult("nessie", "ok", "", 0.0)

    monkeypatch.setattr(probes, "probe_nessie", nessie_ok)
    health = Health()
    phases = ["up", "up", "up", "down", "down", "up", "up"]
    seen: list[tuple[str, str, int, int]] = []  # per round: kafka, redis, clients made so far of each

    def stopping() -> bool:  # asked before each round
        if len(seen) < len(phases) and FakeKafka.made:
            verdicts = {d.name: d.verdict for d in health.report().dependencies}
            seen.append((verdicts["kafka"], verdicts["redis"], len(FakeKafka.made), len(FakeRedis.made)))
        if len(seen) == len(phases):
            return True
        FakeKafka.broker_up = FakeRedis.server_up = phases[len(seen)] == "up"
        return False

    await dependency_watcher(health, Settings.from_env({}), stopping, interval_s=0, timeout_s=1.0)()
    assert [(k, r) for k, r, _, _ in seen] == [("up", "up")] * 3 + [("down", "down")] * 2 + [("up", "up")] * 2
    made = [(k, r) for _, _, k, r in seen]
    assert made[:3] == [(1, 1)] * 3, "a round opened a client while one was kept"
    # Down: the kept client fails, a fresh one tries once and is dropped; each later round tries afresh.
    # Back up: one new client, kept again.
    assert made[3:] == [(2, 2), (3, 3), (4, 4), (4, 4)]
    assert all(k.closed for k in FakeKafka.made)  # none leaked, the last closed as the watcher ended


async def test_a_one_shot_probe_closes_its_client(fakes: None) -> None:
    settings = Settings.from_env({})
    assert (await probes.probe_kafka(settings, 1.0)).ok
    assert [k.closed for k in FakeKafka.made] == [True]
