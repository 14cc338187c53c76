"""The one settings object: every knob, its environment variable, default and trade-off.

Settings are read once from ``CAUSEWAY_*`` environment variables. Each field documents itself
(``help`` in its metadata) so the README's configuration table is generated from this file
(``causeway config --markdown``) and cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


class Secret(str):
    """A string that never shows its value in ``repr`` or logs."""

    def __repr__(self) -> str:
        return "Secret('***')" if self else "Secret('')"

    def reveal(self) -> str:
        return str.__str__(self)


class SettingsError(ValueError):
    """An environment variable holds a value that cannot be used; the message names it."""


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Settings:
    # --- services -------------------------------------------------------------------------------
    kafka_bootstrap: str = _opt("127.0.0.1:9092", "Kafka bootstrap servers, comma-separated.")
    redis_url: str = _opt("redis://127.0.0.1:6379/0", "Redis URL for dedupe marks and cross-worker state.")
    nessie_url: str = _opt("http://127.0.0.1:19120/api/v2", "Nessie REST API v2 base URL.")
    nessie_token: Secret = _opt(Secret(""), "Bearer token for Nessie; empty means no auth. Never logged.")
    nessie_timeout_s: float = _opt(30.0, "Per-request timeout for Nessie calls, seconds.")
    prometheus_url: str = _opt("http://127.0.0.1:9090", "Prometheus base URL (used by tests and the CLI).")
    # --- storage ---------------------------------------------------------------------------------
    warehouse: str = _opt(
        "file://./.causeway/warehouse",
        "Where table data and metadata files go: file:///path (default) or s3://bucket/prefix.",
    )
    s3_endpoint: str = _opt("", "S3 endpoint URL for an s3:// warehouse (MinIO: http://minio:9000).")
    s3_access_key: Secret = _opt(Secret(""), "S3 access key id.")
    s3_secret_key: Secret = _opt(Secret(""), "S3 secret access key. Never logged.")
    s3_region: str = _opt("us-east-1", "S3 region.")
    namespace: str = _opt("onto", "Iceberg namespace that holds entity_events, entity_common, entity_edge.")
    prod_world: str = _opt("prod", "The world id that maps to the main branch.")
    main_branch: str = _opt("main", "Nessie branch of the production world.")
    unknown_world_policy: str = _opt(
        "dlq", "Events for a world without a branch: 'dlq' dead-letters them, 'create' forks main."
    )
    commit_author: str = _opt("causeway", "Author recorded on every Nessie commit.")
    # --- processing ------------------------------------------------------------------------------
    app_id: str = _opt("causeway", "Faust app id; also the Kafka consumer group id.")
    objects_topic: str = _opt("onto.changes.objects", "Object change events topic.")
    links_topic: str = _opt("onto.changes.links", "Link change events topic.")
    dlq_topic: str = _opt("causeway.dlq", "Dead-letter topic; headers carry the reason and origin.")
    topic_partitions: int = _opt(4, "Partitions for topics causeway creates.")
    batch_max_events: int = _opt(10_000, "Flush a world when this many events are buffered.")
    batch_max_seconds: float = _opt(1.0, "Flush at the latest this long after the first buffered event.")
    dedupe_ttl_s: int = _opt(7 * 24 * 3600, "How long an applied event id is remembered in Redis.")
    causal_timeout_s: float = _opt(300.0, "A parked event waits this long for its cause, then dead-letters.")
    max_parked: int = _opt(100_000, "Parked events held in memory before the worker applies backpressure.")
    max_event_bytes: int = _opt(1_048_576, "Larger payloads are dead-lettered as oversized.")
    session_timeout_s: float = _opt(
        10.0,
        "Kafka group session timeout: a crashed worker's partitions move after this long. Lower "
        "moves them sooner; too low evicts a worker busy in a long flush.",
    )
    commit_retries: int = _opt(8, "Nessie OCC conflict retries before a flush fails (nothing is acked).")
    commit_backoff_s: float = _opt(0.05, "Base of the jittered exponential backoff between commit retries.")
    snapshot_expire_every: int = _opt(20, "Expire old snapshots every N commits per table to bound metadata.")
    target_file_bytes: int = _opt(64 * 1024 * 1024, "Roll data files at about this many bytes.")
    # --- schema sync and reconciliation (agents/schema_sync.py, agents/reconcile.py) -------------
    schema_topic: str = _opt(
        "onto.schema.updated", "Control-plane schema.updated events (models.schema), consumed by schema sync."
    )
    schema_answer_topic: str = _opt(
        "onto.storage.schema.updated", "Schema sync's storage.schema.updated answers (applied, duplicate, refused)."
    )
    schema_intelligence_topic: str = _opt(
        "onto.intelligence.schema.updated",
        "The intelligence layer's schema acknowledgements ({world_id, version}) for the version vector.",
    )
    control_counts_topic: str = _opt(
        "onto.control.counts",
        "Control-plane object count checkpoints per world and type (docs/schema.md), read by reconciliation.",
    )
    reconcile_interval_s: float = _opt(
        300.0, "Reconciliation runs this often per worker that runs it; 0 disables the timer (CLI only)."
    )
    reconcile_threshold: int = _opt(
        0,
        "Repair a type when a count differs by more than this (control, projection, event log). 0 repairs "
        "any drift; higher tolerates in-flight events between the control count and the branch.",
    )
    # --- observability ---------------------------------------------------------------------------
    web_port: int = _opt(6066, "Worker HTTP port: /metrics and /health.")
    log_level: str = _opt("info", "Log level: debug, info, warning, error.")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``CAUSEWAY_<FIELD>`` variables; raises SettingsError on bad values."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(env_name(f.name))
            if raw is None:
                continue
            values[f.name] = _coerce(f, raw)
        values.update(overrides)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.unknown_world_policy not in ("dlq", "create"):
            raise SettingsError(
                f"{env_name('unknown_world_policy')}={self.unknown_world_policy!r}: use 'dlq' or 'create'"
            )
        if not self.warehouse.startswith(("file://", "s3://", "/")):
            raise SettingsError(f"{env_name('warehouse')}={self.warehouse!r}: use file:///path or s3://bucket")
        for name in ("batch_max_events", "topic_partitions", "max_parked", "commit_retries"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{env_name(name)} must be at least 1")
        _check_urls(self)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _check_urls(s: Settings) -> None:
    """Each service URL is well formed (a command then fails on the service, not on a typo)."""
    schemes = {"nessie_url": ("http", "https"), "prometheus_url": ("http", "https"), "redis_url": ("redis", "rediss")}
    for name, allowed in schemes.items():
        parts = urlsplit(getattr(s, name))
        if name == "redis_url" and parts.scheme == "unix":
            continue
        if parts.scheme not in allowed or not parts.hostname:
            raise SettingsError(f"{env_name(name)}={getattr(s, name)!r} is not a URL: use {allowed[0]}://host:port...")
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError as exc:
            raise SettingsError(f"{env_name(name)}={getattr(s, name)!r}: {exc}") from exc
    for server in s.kafka_bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit():
            raise SettingsError(f"{env_name('kafka_bootstrap')}={s.kafka_bootstrap!r}: use host:port[,host:port]")


def env_name(field_name: str) -> str:
    return "CAUSEWAY_" + field_name.upper()


def _coerce(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = type(f.default)
    try:
        if kind is bool:
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if kind is int:
            return int(raw.replace("_", ""))
        if kind is float:
            return float(raw)
        if kind is Secret:
            return Secret(raw)
        return raw
    except ValueError as exc:
        raise SettingsError(f"{env_name(f.name)}={raw!r} is not a valid {kind.__name__}") from exc


def markdown_table() -> str:
    """The README's configuration table."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(Settings):
        default = "" if isinstance(f.default, Secret) else f.default
        rows.append(f"| `{env_name(f.name)}` | `{default}` | {f.metadata['help']} |")
    return "\n".join(rows)
