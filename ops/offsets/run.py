"""Consumer-group I/O for `causeway offsets`: describe the group, read lag, commit reset offsets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata

from ops.offsets.plan import GroupState, LagRow, Member, ResetRow, check_resettable


async def describe_group(bootstrap: str, group: str, kafka_options: dict[str, Any] | None = None) -> GroupState:
    """The group's state and members as the group coordinator reports them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(kafka_options or {}))
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    for resp in responses:
        for g in resp.to_object()["groups"]:
            if g.get("group") != group:
                continue
            members = tuple(
                Member(m.get("member_id", ""), m.get("client_id", ""), m.get("client_host", ""))
                for m in g.get("members") or ()
            )
            return GroupState(group, g.get("state") or "Dead", members)
    return GroupState(group, "Dead", ())


async def _partitions(consumer: AIOKafkaConsumer, topics: Sequence[str]) -> list[TopicPartition]:
    out = []
    for topic in topics:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await consumer._client.force_metadata_update()  # metadata is fetched lazily
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise ValueError(f"topic {topic} does not exist")
        out += [TopicPartition(topic, p) for p in sorted(parts)]
    return out


async def partition_offsets(
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    at_ms: int | None = None,
    kafka_options: dict[str, Any] | None = None,
) -> tuple[list[LagRow], dict[tuple[str, int], int | None]]:
    """Committed/start/end per partition (and ``offsets_for_times(at_ms)`` when asked)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **(kafka_options or {}))
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(kafka_options or {}))
    await consumer.start()
    await admin.start()
    try:
        tps = await _partitions(consumer, topics)
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        committed = await admin.list_consumer_group_offsets(group)
        by_time: dict[tuple[str, int], int | None] = {}
        if at_ms is not None:
            found = await consumer.offsets_for_times(dict.fromkeys(tps, at_ms))
            by_time = {(tp.topic, tp.partition): (o.offset if o is not None else None) for tp, o in found.items()}
        rows = []
        for tp in tps:
            meta = committed.get(tp)
            off = meta.offset if meta is not None and meta.offset >= 0 else None
            rows.append(LagRow(tp.topic, tp.partition, off, starts[tp], ends[tp]))
        return rows, by_time
    finally:
        await consumer.stop()
        await admin.close()


async def commit_reset(
    bootstrap: str, group: str, rows: Sequence[ResetRow], kafka_options: dict[str, Any] | None = None
) -> GroupState:
    """Commit the planned offsets for ``group``, checking again that it has no members.

    The broker also refuses a commit from outside the group's generation while members are
    active, so a worker that joins between the check and the commit cannot be overwritten.
    """
    state = await describe_group(bootstrap, group, kafka_options)
    check_resettable(state)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, **(kafka_options or {})
    )
    await consumer.start()
    try:
        tps = [TopicPartition(r.topic, r.partition) for r in rows]
        consumer.assign(tps)
        await consumer.commit({TopicPartition(r.topic, r.partition): OffsetAndMetadata(r.target, "") for r in rows})
    finally:
        await consumer.stop()
    return state
