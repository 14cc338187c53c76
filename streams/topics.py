"""Create the topics causeway consumes and produces, before any consumer subscribes to them."""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.security import kafka_client_options
from streams.settings import Settings

log = logging.getLogger(__name__)


# Room for key, headers and record framing above the largest value causeway writes to a topic.
#: Kafka's default ``message.max.bytes`` (1 MiB plus the record batch overhead).
BROKER_DEFAULT_MESSAGE_BYTES = 1_048_588
MESSAGE_HEADROOM_BYTES = 65_536


def message_bytes_needed(settings: Settings) -> dict[str, int]:
    """``max.message.bytes`` each topic causeway writes needs: its largest value plus headroom.

    Change topics carry events up to ``max_event_bytes``; the DLQ carries raw values up to the larger
    of that and the CDC ingest's ``cdc_dlq_max_value_bytes``.
    """
    # Never below the broker's default: a topic that refuses an oversized event at produce time would
    # take the "oversized" dead letter (a reason the producer can act on) away from it.
    change = max(BROKER_DEFAULT_MESSAGE_BYTES, settings.max_event_bytes + MESSAGE_HEADROOM_BYTES)
    dlq = max(
        BROKER_DEFAULT_MESSAGE_BYTES,
        max(settings.max_event_bytes, settings.cdc_dlq_max_value_bytes) + MESSAGE_HEADROOM_BYTES,
    )
    return {settings.objects_topic: change, settings.links_topic: change, settings.dlq_topic: dlq}


async def ensure_topics(settings: Settings, extra: dict[str, int] | None = None) -> list[str]:
    """Create missing topics (change topics with ``topic_partitions``, the DLQ with one partition).

    The change and DLQ topics get a ``max.message.bytes`` that fits ``message_bytes_needed``.
    Returns the names it created. Existing topics are left as they are, whatever their partitions.
    """
    wanted = {
        settings.objects_topic: settings.topic_partitions,
        settings.links_topic: settings.topic_partitions,
        settings.dlq_topic: 1,
        **(extra or {}),
    }
    return await _create_missing(settings, wanted)


async def ensure_topic(settings: Settings, name: str, partitions: int = 1) -> bool:
    """Create one topic if it is missing; True when it was created.

    Producing to a missing topic also creates it (the broker's auto-create), but aiokafka first logs
    ``ERROR aiokafka.cluster: Topic ... not found in cluster metadata``: a healthy first run must not.
    """
    return bool(await _create_missing(settings, {name: partitions}))


async def _create_missing(settings: Settings, wanted: dict[str, int]) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **kafka_client_options(settings))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        sizes = message_bytes_needed(settings)
        missing = [
            NewTopic(name, n, 1, topic_configs={"max.message.bytes": str(sizes[name])} if name in sizes else None)
            for name, n in wanted.items()
            if name not in existing
        ]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another worker won the race
            log.info("created topics: %s", ", ".join(t.name for t in missing))
        return [t.name for t in missing]
    finally:
        await admin.close()
