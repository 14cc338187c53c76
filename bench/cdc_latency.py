"""The latency phase with ``--debezium``: from a Debezium envelope's publish time to its Nessie commit.

The harness measures latency per change-topic record (a commit records the change-topic offsets it
carries). With the CDC ingest in front, what is published is an envelope on ``cdc.raw.*``; the
ingest turns it into a change event at some offset of ``onto.changes.*``. The envelope and its event
share the entity pk and the version (the envelope's ``source.lsn``), so the envelopes' publish
times are re-keyed to the change-topic offsets of their events (pure: ``latency_offsets``), read
back from the change topics after the phase (``read_changes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from cli.workload import CdcRecord

Offsets = dict[tuple[str, int, int], tuple[int, int]]  # (topic, partition, offset) → (timestamp ms, bytes)
Change = tuple[str, int, int, bytes]  # topic, partition, offset, value


def envelope_index(records: Sequence[CdcRecord], published: Offsets) -> dict[tuple[str, int], tuple[int, int]]:
    """(pk, version) → (publish time ms, bytes) of each envelope; ``published`` is in ``records`` order."""
    if len(published) != len(records):
        raise ValueError(f"{len(published)} publish results for {len(records)} envelopes")
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for rec, sent in zip(records, published.values(), strict=True):
        doc = orjson.loads(rec.value)
        row = doc.get("after") or doc.get("before") or {}
        out[(str(row.get("id")), int(doc["source"]["lsn"]))] = sent
    return out


def latency_offsets(changes: Iterable[Change], index: Mapping[tuple[str, int], tuple[int, int]]) -> Offsets:
    """The envelopes' publish times keyed by the change-topic offsets of the events made from them."""
    out: Offsets = {}
    for topic, partition, offset, value in changes:
        doc = orjson.loads(value)
        pk = doc.get("object_pk") or doc.get("link_pk")
        sent = index.get((str(pk), int(doc.get("version", -1))))
        if sent is not None:
            out[(topic, partition, offset)] = sent
    return out


async def end_offsets(bootstrap: str, topics: Sequence[str], partitions: int) -> dict[tuple[str, int], int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **_kafka_options())
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(t, p) for t in topics for p in range(partitions)])
        return {(tp.topic, tp.partition): off for tp, off in ends.items()}
    finally:
        await consumer.stop()


async def read_changes(bootstrap: str, starts: Mapping[tuple[str, int], int]) -> list[Change]:
    """Every record of the given partitions from ``starts`` up to their current end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **_kafka_options())
    await consumer.start()
    out: list[Change] = []
    try:
        tps = [TopicPartition(t, p) for t, p in starts]
        if not tps:
            return out
        consumer.assign(tps)
        ends: dict[Any, int] = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, starts[(tp.topic, tp.partition)])
        left = {tp for tp in tps if ends[tp] > starts[(tp.topic, tp.partition)]}
        idle = 0
        while left and idle < 30:  # the records exist (below the end offsets): only a slow broker waits
            batch = await consumer.getmany(*left, timeout_ms=1000)
            idle = 0 if batch else idle + 1
            for tp, recs in batch.items():
                out.extend((r.topic, r.partition, r.offset, r.value) for r in recs if r.offset < ends[tp])
                if recs and recs[-1].offset + 1 >= ends[tp]:
                    left.discard(tp)
        return out
    finally:
        await consumer.stop()


def _kafka_options() -> dict[str, object]:
    """The security options of the environment's settings (this module's helpers take a bootstrap only)."""
    from streams.security import kafka_client_options
    from streams.settings import Settings

    return kafka_client_options(Settings.from_env())
