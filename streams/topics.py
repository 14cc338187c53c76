"""Create the topics causeway consumes and produces, before any consumer subscribes to them."""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.security import kafka_client_options
from streams.settings import Settings

log = logging.getLogger(__name__)


async def ensure_topics(settings: Settings, extra: dict[str, int] | None = None) -> list[str]:
    """Create missing topics (change topics with ``topic_partitions``, the DLQ with one partition).

    Returns the names it created. Existing topics are left as they are, whatever their partitions.
    """
    wanted = {
        settings.objects_topic: settings.topic_partitions,
        settings.links_topic: settings.topic_partitions,
        settings.dlq_topic: 1,
        **(extra or {}),
    }
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **kafka_client_options(settings))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(name, n, 1) for name, n in wanted.items() if name not in existing]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another worker won the race
            log.info("created topics: %s", ", ".join(t.name for t in missing))
        return [t.name for t in missing]
    finally:
        await admin.close()
