"""The dashboards and the lag metric, against a real worker that the real Prometheus scrapes.

One `causeway worker` process (tests/integration/pipeline.py) and one lag exporter
(`python -m monitoring.lag_exporter`, watching this test's group and topics) serve /metrics on ports
the running Prometheus scrapes: they register in its discovery folder (CAUSEWAY_PROMETHEUS_SD_DIR),
and the ports come from the fixed list an older scripts/services.sh scraped (6066 is left to a demo
worker and 6070 to test_dashboards_live), so either configuration finds them. The worker consumes a
few thousand events published in waves while Prometheus scrapes it: updates, deletes, links,
duplicates (producer retries), bad input (dead letters, some of them in the test's own world), causal
events whose cause comes later (parked, then released), and one event whose cause never arrives. That
last one stays parked (the causal timeout is 10 minutes), so its partition's committed offset stops
there: a steady, non-zero lag once the rest has drained.

* Every dashboard query, with the world and topic variables set to this test's world and topics, must
  parse and return data unless its panel documents why it may be empty at rest; every metric such a
  query reads must come from this worker's (or this test's exporter's) scrape, not another target.
* ``causeway_consumer_lag_messages`` from the lag exporter, as Prometheus stored it, must equal,
  partition by partition, the LAG column of Kafka's own ``ConsumerGroupCommand --describe`` for the
  group (tolerance: 0 messages, since nothing moves in the steady state; see LAG_TOLERANCE).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from cli.workload import Record, generate
from models.events import ChangeEvent, ChangeType, EntityKind
from monitoring import docs, promql_check
from tests.factories import change_event
from tests.integration.pipeline import ROOT, Pipeline, Worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Prometheus scrape targets (scripts/services.sh) this test may use: 6066 is the default worker port
# (a demo may run there) and test_dashboards_live serves 6070.
SCRAPED_PORTS = (6067, 6068, 6069, 6071)
WAVES = 6
WAVE_GAP_S = 1.5  # waves span several 2 s scrapes, so rate() and histogram_quantile() see increases
LAG_TOLERANCE = 0  # messages per partition, in the steady state (nothing produced or committed)
LAG_EXPORT_S = 1.0  # the lag exporter's poll interval in this test
# Panels documented as possibly empty at rest that this load must fill: it has bad input, causal
# events with late causes, and an event parked for good.
LOAD_FILLS = {
    "Dead-lettered events/s by world",
    "Parked and released/s",
    "Causal wait",
    "Oldest in-flight event age",
}


@dataclasses.dataclass
class Live:
    pipe: Pipeline
    worker: Worker
    instance: str
    exporter_instance: str
    world: str
    orphan_partition: int
    orphan_offset: int
    records: int


def _scraped_port(taken: tuple[int, ...] = ()) -> int:
    for port in SCRAPED_PORTS:
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail(f"every scraped port {SCRAPED_PORTS} is taken; stop what listens there", pytrace=False)


def _query(prometheus_url: str, promql: str) -> list[dict]:
    body = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def _wait_scraped(prometheus_url: str, instance: str, since: float, timeout: float = 20) -> None:
    """Until Prometheus has scraped ``instance`` successfully after ``since`` (Unix time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in _query(prometheus_url, f'timestamp(up{{job=~"causeway.*", instance="{instance}"}} == 1)'):
            if float(s["value"][1]) >= since:
                return
        time.sleep(0.5)
    pytest.fail(f"Prometheus did not scrape {instance} within {timeout:.0f}s", pytrace=False)


def _bad_records(world: str, unique: str) -> list[Record]:
    """Invalid events that still name our world, so the per-world dead-letter panel has data."""
    base = {"world_id": world, "object_type": "Sensor", "object_pk": "x", "after_properties": {}, "version": 1}
    values = [
        {**base, "event_id": f"{unique}-bad-{i}", "change_type": "EXPLODE", "occurred_at": 0} for i in range(3)
    ] + [{k: v for k, v in base.items() if k != "version"} | {"event_id": f"{unique}-bad-v", "change_type": "CREATE"}]
    return [Record(EntityKind.OBJECT, f"{world}::x".encode(), orjson.dumps(v), None) for v in values]


def _restamp(records: list[Record], now_ms: int, stamped: dict[str, ChangeEvent]) -> list[Record]:
    """The workload's occurred_at is fixed in the past: stamp events as produced now, so end-to-end
    latency is meaningful. A duplicate keeps its first copy's stamp."""
    out = []
    for r in records:
        if r.event is None:
            out.append(r)
            continue
        ev = stamped.setdefault(r.event.event_id, dataclasses.replace(r.event, occurred_at_ms=now_ms))
        out.append(Record(r.kind, r.key, ev.encode(), ev))
    return out


async def _publish_orphan(pipe: Pipeline, world: str, unique: str) -> tuple[int, int]:
    """An event whose cause is never published: it stays parked. Returns its (partition, offset)."""
    ev = change_event(
        f"{unique}-orphan",
        world=world,
        entity_type="Sensor",
        pk=f"orphan-{unique}",
        change=ChangeType.CREATE,
        after={"name": "orphan"},
        caused_by=f"{unique}-never-published",
        occurred_at_ms=int(time.time() * 1000),
        schema_version=1,
    )
    producer = AIOKafkaProducer(bootstrap_servers=pipe.settings.kafka_bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(pipe.settings.objects_topic, ev.encode(), key=ev.key.encode())
        return meta.partition, meta.offset
    finally:
        await producer.stop()


@pytest.fixture(scope="module")
def live(prometheus_url: str, nessie_url: str, redis_url: str, tmp_path_factory) -> Iterator[Live]:
    unique = uuid.uuid4().hex[:10]
    tmp: Path = tmp_path_factory.mktemp("metrics-live")
    port = _scraped_port()
    exporter_port = _scraped_port(taken=(port,))
    pipe = asyncio.run(
        Pipeline.create(
            unique,
            tmp,
            causal_timeout_s=600.0,
            batch_max_events=200,
            batch_max_seconds=0.3,
            lag_exporter_port=exporter_port,
            lag_poll_interval_s=LAG_EXPORT_S,
        )
    )
    started = time.time()
    worker = pipe.start_worker(port=port)
    instance = f"127.0.0.1:{port}"
    # Lag is measured outside the worker: the lag exporter for this test's group and topics.
    exporter = subprocess.Popen(
        [sys.executable, "-m", "monitoring.lag_exporter"],
        cwd=ROOT,
        env=pipe.env,
        stdout=(tmp / "lag-exporter.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    exporter_instance = f"127.0.0.1:{exporter_port}"
    try:
        _wait_scraped(prometheus_url, instance, started)
        _wait_scraped(prometheus_url, exporter_instance, started)
        params = pipe.params(
            events=3000, worlds=2, keys=120, seed=23, duplicate_rate=0.04, bad_rate=0.015, causal_share=0.2
        )
        world = params.world_ids()[1]  # not "prod": a demo worker may write world prod too
        wl = generate(params)
        records = list(wl.records)
        for i, bad in enumerate(_bad_records(world, unique)):
            records.insert(50 * (i + 1), bad)  # in the first wave: the series exist early
        chunk = -(-len(records) // WAVES)
        stamped: dict[str, ChangeEvent] = {}
        orphan = (-1, -1)
        for i in range(WAVES):
            wave = _restamp(records[i * chunk : (i + 1) * chunk], int(time.time() * 1000), stamped)
            asyncio.run(pipe.publish(wave))
            if i == 1:
                orphan = asyncio.run(_publish_orphan(pipe, world, unique))
            time.sleep(WAVE_GAP_S)
        total = len(records) + 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            summary = worker.summary()
            if summary["consumed"] >= total and summary["parked"] == 1 and summary["in_flight"] == 1:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"worker did not settle: {worker.summary()}\n{worker.log.read_text()[-3000:]}")
        yield Live(pipe, worker, instance, exporter_instance, world, orphan[0], orphan[1], total)
    finally:
        pipe.stop_all()
        exporter.terminate()
        exporter.wait(timeout=30)


def test_every_panel_query_returns_data_from_the_real_worker(prometheus_url: str, live: Live) -> None:
    s = live.pipe.settings
    variables = {
        "world": promql_check.regex_value(live.world),
        "topic": f"{promql_check.regex_value(s.objects_topic)}|{promql_check.regex_value(s.links_topic)}",
    }
    queries = promql_check.panel_queries()
    assert LOAD_FILLS <= {q.panel for q in queries if q.empty_at_rest}, "LOAD_FILLS names a panel that is gone"
    deadline = time.monotonic() + 30
    while True:
        results = promql_check.check_live(prometheus_url, queries, variables)
        if all(_good(r) for r in results) or time.monotonic() > deadline:
            break
        time.sleep(2)
    report = promql_check.report(results)
    print(f"\nworld {live.world}, worker {live.instance}:\n{report}")
    assert len(results) == len(queries) > 0
    assert all(r.ok for r in results), f"queries that Prometheus rejected:\n{report}"
    missing = [r for r in results if not r.acceptable]
    assert not missing, f"queries without data that are not documented as empty at rest:\n{report}"
    unfilled = [r.query.key for r in results if not _good(r)]
    assert not unfilled, f"panels this load must fill ({sorted(LOAD_FILLS)}) without data: {unfilled}"

    # The data must come from this worker (or this test's lag exporter), not from another scrape
    # target (a demo, another test).
    needed = sorted({n for r in results if not r.query.empty_at_rest for n in docs.metric_names(r.query.expr)})
    ours = f"{live.instance}|{live.exporter_instance}"
    absent = [
        name
        for name in needed
        if not _query(prometheus_url, f'count({{__name__=~"{name}(_bucket)?", instance=~"{ours}"}})')
    ]
    assert not absent, f"metrics read by panels without data from {ours}: {absent}"

    # With the variables at "All" (.*), as a dashboard opens, every query parses as well.
    all_worlds = promql_check.check_live(prometheus_url, queries)
    assert all(r.ok for r in all_worlds), promql_check.report(r for r in all_worlds if not r.ok)


def _good(r: promql_check.QueryResult) -> bool:
    return r.acceptable and (r.has_data or r.query.panel not in LOAD_FILLS)


def test_consumer_lag_matches_kafka_consumer_group_command(prometheus_url: str, live: Live) -> None:
    s = live.pipe.settings
    topics = (s.objects_topic, s.links_topic)
    ours: dict[tuple[str, int], int] = {}
    broker: dict[tuple[str, int], int] = {}
    recorded = -1
    # Steady state: once the last commit is older than one lag export, one scrape and one rule
    # evaluation, Prometheus's numbers must agree with the broker's. Until then they may trail.
    deadline = time.monotonic() + 3 * LAG_EXPORT_S + 10
    while time.monotonic() < deadline:
        broker = _broker_lag(s.kafka_bootstrap, s.app_id, topics)
        series = _query(
            prometheus_url, f'causeway_consumer_lag_messages{{instance="{live.exporter_instance}", group="{s.app_id}"}}'
        )
        ours = {(x["metric"]["topic"], int(x["metric"]["partition"])): int(float(x["value"][1])) for x in series}
        # The recording rule the lag alerts read, summed over this test's topics.
        total = _query(
            prometheus_url,
            f'sum(causeway:consumer_lag_messages:topic{{topic=~"{"|".join(topics)}"}})',  # this group's topics only
        )
        recorded = int(float(total[0]["value"][1])) if total else -1
        agree = ours.keys() == broker.keys() and all(abs(ours[k] - broker[k]) <= LAG_TOLERANCE for k in broker)
        if agree and abs(recorded - sum(broker.values())) <= LAG_TOLERANCE * len(broker):
            break
        time.sleep(1)
    print("\npartition: ours / broker\n" + "\n".join(f"{k}: {ours.get(k)} / {v}" for k, v in sorted(broker.items())))
    assert len(broker) == 2 * s.topic_partitions, broker
    assert ours.keys() == broker.keys(), f"partitions differ: ours {sorted(ours)}, broker {sorted(broker)}"
    diffs = {k: ours[k] - broker[k] for k in broker if abs(ours[k] - broker[k]) > LAG_TOLERANCE}
    assert not diffs, f"lag differs beyond {LAG_TOLERANCE}: {diffs}; ours {ours}, broker {broker}"

    # The parked orphan holds its partition at its own offset; every other partition has drained.
    held = (s.objects_topic, live.orphan_partition)
    assert broker[held] > 0
    assert all(v == 0 for k, v in broker.items() if k != held), broker
    committed = _query(
        prometheus_url,
        f'causeway_partition_committed_offset{{group="{s.app_id}", topic="{held[0]}", partition="{held[1]}"}}',
    )
    assert int(float(committed[0]["value"][1])) == live.orphan_offset
    assert abs(recorded - sum(broker.values())) <= LAG_TOLERANCE * len(broker), (recorded, broker)


_LINE = re.compile(r"^(\S+)\s+(\S+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s")


def _broker_lag(bootstrap: str, group: str, topics: tuple[str, ...]) -> dict[tuple[str, int], int]:
    """LAG per partition of ``topics`` from Kafka's ConsumerGroupCommand (kafka-consumer-groups.sh)."""
    libs = os.environ.get("CAUSEWAY_KAFKA_LIBS")
    if not libs:
        pytest.fail('CAUSEWAY_KAFKA_LIBS is not set; run: eval "$(scripts/services.sh env)"', pytrace=False)
    cmd = [
        "java",
        "-cp",
        f"{libs}/*",
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        "--bootstrap-server",
        bootstrap,
        "--describe",
        "--group",
        group,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[tuple[str, int], int] = {}
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) == group and m.group(2) in topics:
            lag = m.group(6)
            assert lag != "-", f"the group has no committed offset for {m.group(2)}/{m.group(3)}: {line}"
            out[(m.group(2), int(m.group(3)))] = int(lag)
    return out
