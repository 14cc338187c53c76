"""The Faust app: one worker process, its topics, and its HTTP endpoints (/metrics, /health).

Agents attach themselves in ``agents/``; ``build_app`` wires the ones a worker runs. Records are
read as raw bytes: decoding is batched with orjson in the agents, so a bad record becomes a dead
letter with a reason instead of a Faust deserialisation crash.
"""

from __future__ import annotations

from pathlib import Path

import faust
from prometheus_client import CollectorRegistry

from streams.security import faust_broker_credentials
from streams.settings import Settings


def create_app(settings: Settings, registry: CollectorRegistry | None = None) -> faust.App:
    """A Faust app configured from settings; serves ``registry`` plus Faust's sensors on /metrics."""
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{hp.strip()}" for hp in settings.kafka_bootstrap.split(",")],
        broker_credentials=faust_broker_credentials(settings),
        store="memory://",
        datadir=f"{settings.data_dir}/{settings.app_id}-data",  # Faust's own default is the working directory
        web_host="127.0.0.1",
        web_bind=settings.web_bind,
        web_port=settings.web_port,
        web_in_thread=False,
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        # Offsets are acked by the agents only after a Nessie commit or a dead letter; commit them
        # often so a restart re-reads little.
        broker_commit_every=1000,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=max(1.0, settings.session_timeout_s / 5),
        broker_commit_interval=1.0,
        stream_wait_empty=False,
        # Our agents never raise into Faust; if one does, the worker must stop rather than skip.
        agent_supervisor="mode.OneForAllSupervisor",
        value_serializer="raw",
        key_serializer="raw",
        # New topics (cdc.raw.* patterns) are noticed within this many seconds.
        consumer_max_fetch_size=4 * 1024 * 1024,
    )
    if registry is not None:
        from faust.sensors.prometheus import setup_prometheus_sensors

        setup_prometheus_sensors(app, "/metrics", registry, name_prefix="faust")
    return app


def change_topics(app: faust.App, settings: Settings) -> faust.TopicT:
    """Both change topics as one Faust topic: causes and effects may sit on either."""
    return app.topic(
        settings.objects_topic,
        settings.links_topic,
        key_type=bytes,
        value_type=bytes,
        partitions=settings.topic_partitions,
        acks=True,
    )


def dlq_topic(app: faust.App, settings: Settings) -> faust.TopicT:
    return app.topic(settings.dlq_topic, key_type=bytes, value_type=bytes, partitions=1)
