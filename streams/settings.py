"""The one settings object: every knob, its environment variable, default and trade-off.

Settings are read once from ``CAUSEWAY_*`` environment variables. Each field documents itself
(``help`` in its metadata) so the README's configuration table is generated from this file
(``causeway config --markdown``) and cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from models.errors import ConfigError


class Secret(str):
    """A string that never shows its value: ``repr``, ``str``, f-strings and ``%s`` print ``***``.

    ``reveal()`` gives the value, only where a client library needs it (streams/security.py).
    """

    def __repr__(self) -> str:
        return "Secret('***')" if self else "Secret('')"

    def __str__(self) -> str:
        return "***" if self else ""

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def reveal(self) -> str:
        return str.__str__(self)


class SecretUrl(Secret):
    """A URL that may carry credentials; it prints with the password (and token-like user) masked."""

    def __repr__(self) -> str:
        return repr(str(self))

    def __str__(self) -> str:
        return mask_url(self.reveal())


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``redis://:***@host:6379/0``)."""
    url = str.__str__(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    if parts.password is None and "@" not in parts.netloc:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    masked = f"{user}:***@{host}" if parts.password is not None else f"***@{host}"
    return urlunsplit(parts._replace(netloc=masked))


class SettingsError(ConfigError, ValueError):
    """An environment variable holds a value that cannot be used; the message names it."""


#: Arrow memory pools the worker can make its default (``streams.memory.configure``).
MEMORY_POOLS = ("default", "system", "jemalloc", "mimalloc")
#: Arrow's bundled jemalloc reads its options from this variable once, when libarrow loads.
JEMALLOC_CONF_ENV = "JE_ARROW_MALLOC_CONF"
#: Freed pages go back to the OS at once instead of after Arrow's 1 s muzzy decay: a flush's large
#: transients (log merges, key lookups) are otherwise held between flushes.
JEMALLOC_CONF_DEFAULT = "muzzy_decay_ms:0"
#: The pool Arrow's C++ code takes for itself (the Parquet writer and reader, compute kernels) is
#: chosen from this variable once, when libarrow loads; ``pa.set_memory_pool`` changes only the
#: pool pyarrow's own calls use (docs/benchmarks.md, "2026-12-03 noon").
ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
#: ``CAUSEWAY_ARROW_CPP_POOL``'s default: pyarrow's own choice (mimalloc).
ARROW_CPP_POOL_DEFAULT = "default"


def native_pool_env(pool: str) -> str | None:
    """The ``ARROW_DEFAULT_MEMORY_POOL`` value that puts Arrow's C++ code on ``pool`` (pure);
    None for "default" (pyarrow's choice) and for a name that is not a pool (refused later)."""
    return pool if pool in MEMORY_POOLS and pool != "default" else None


#: ``mallopt`` takes a C int: a larger arena cap would reach glibc truncated, not refused.
MAX_MALLOC_ARENAS = 2**31 - 1


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Settings:
    # --- services -------------------------------------------------------------------------------
    kafka_bootstrap: str = _opt("127.0.0.1:9092", "Kafka bootstrap servers, comma-separated.")
    redis_url: SecretUrl = _opt(
        SecretUrl("redis://127.0.0.1:6379/0"),
        "Redis URL for dedupe marks and cross-worker state; rediss:// for TLS. A password in it is masked.",
    )
    nessie_url: SecretUrl = _opt(SecretUrl("http://127.0.0.1:19120/api/v2"), "Nessie REST API v2 base URL.")
    nessie_token: Secret = _opt(Secret(""), "Bearer token for Nessie; empty means no auth. Never logged.")
    # --- security (streams/security.py, docs/security.md) ---------------------------------------
    kafka_security_protocol: str = _opt(
        "PLAINTEXT", "Kafka security protocol: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL."
    )
    kafka_sasl_mechanism: str = _opt(
        "SCRAM-SHA-512", "SASL mechanism for SASL_*: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER."
    )
    kafka_sasl_username: str = _opt("", "SASL user name (PLAIN and SCRAM).")
    kafka_sasl_password: Secret = _opt(Secret(""), "SASL password (PLAIN and SCRAM). Never logged.")
    kafka_oauth_token_file: str = _opt("", "OAUTHBEARER: file holding the current token (re-read on refresh).")
    kafka_oauth_token_command: str = _opt(
        "", "OAUTHBEARER: shell command printing a token on stdout (used when no token file is set)."
    )
    kafka_oauth_refresh_s: float = _opt(300.0, "OAUTHBEARER: a token is reused this long, then read again.")
    kafka_ssl_ca_file: str = _opt("", "PEM CA bundle that signed the brokers' certificates; empty: system CAs.")
    kafka_ssl_cert_file: str = _opt("", "PEM client certificate for mutual TLS; empty: none.")
    kafka_ssl_key_file: str = _opt("", "PEM private key of the client certificate.")
    kafka_ssl_key_password: Secret = _opt(Secret(""), "Password of an encrypted client key. Never logged.")
    kafka_ssl_check_hostname: bool = _opt(
        True, "Check that the broker certificate names the host (certificates are always verified)."
    )
    redis_username: str = _opt("", "Redis ACL user; a user in CAUSEWAY_REDIS_URL wins.")
    redis_password: Secret = _opt(Secret(""), "Redis password; a password in CAUSEWAY_REDIS_URL wins. Never logged.")
    redis_ca_file: str = _opt("", "PEM CA bundle for a rediss:// URL; empty: system CAs.")
    nessie_ca_file: str = _opt("", "PEM CA bundle for an https:// Nessie URL; empty: system CAs.")
    nessie_oauth_token_url: str = _opt(
        "", "OAuth2 token endpoint for Nessie (client credentials); set it to use OAuth2 instead of a static token."
    )
    nessie_oauth_client_id: str = _opt("", "OAuth2 client id for Nessie.")
    nessie_oauth_client_secret: Secret = _opt(Secret(""), "OAuth2 client secret for Nessie. Never logged.")
    nessie_oauth_scope: str = _opt("", "OAuth2 scope to ask for; empty asks for none.")
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
    app_id: str = _opt("causeway", "Consumer group of the change topics; Faust's app id is <app_id>-faust.")
    data_dir: str = _opt(
        "./.causeway/run/data",
        "Directory for the worker's local state (Faust's `<app_id>-data` folder); relative to the working directory.",
    )
    objects_topic: str = _opt("onto.changes.objects", "Object change events topic.")
    links_topic: str = _opt("onto.changes.links", "Link change events topic.")
    dlq_topic: str = _opt("causeway.dlq", "Dead-letter topic; headers carry the reason and origin.")
    topic_partitions: int = _opt(4, "Partitions for topics causeway creates.")
    batch_max_events: int = _opt(
        10_000,
        "Records read per poll; the worker stops reading while 3 x this many events are buffered "
        "(commits lagging). A world's batch is due at batch_flush_events.",
    )
    intake_fetch_wait_ms: int = _opt(
        100,
        "How long Kafka may hold the intake's fetch of the change topics until intake_fetch_min_bytes "
        "have arrived (the consumer's fetch.max.wait.ms): at most this much latency, for polls that each "
        "bring a trickle's worth of records instead of a few (a poll costs the worker a few ms of CPU "
        "however few records it brings).",
    )
    intake_fetch_min_bytes: int = _opt(
        1_048_576,
        "Bytes that end the intake's fetch wait at once (fetch.min.bytes): a backlog is read at full "
        "speed. 1 returns every fetch as soon as any record arrives.",
    )
    batch_flush_events: int = _opt(
        2_000,
        "Flush a world's batch once it holds this many events (at most batch_max_events). Its commit "
        "then runs beside the intake; while it is in flight the world's next batch keeps growing, so "
        "commits carry more events at higher rates.",
    )
    batch_max_seconds: float = _opt(1.0, "Flush at the latest this long after the first buffered event.")
    batch_flush_when_idle: bool = _opt(
        True,
        "Flush buffered batches as soon as the intake catches up (a poll returns fewer than "
        "batch_max_events records) instead of waiting for batch_max_seconds. Low latency at low rates; "
        "at high rates a world's batch still grows while its previous commit is in flight.",
    )
    batch_idle_min_seconds: float = _opt(
        0.5,
        "With CAUSEWAY_BATCH_FLUSH_WHEN_IDLE, an idle intake flushes a world's batch only once its first "
        "event is this old (at most batch_max_seconds). 0 commits at once; more commits less often, with "
        "more events each, for less CPU per event at low and moderate rates.",
    )
    batch_busy_cpu: float = _opt(
        0.8,
        "Worker CPU (share of a core, smoothed over ~3 s) at which an idle intake's flush age reaches "
        "batch_max_seconds; from half of it the age stretches up from batch_idle_min_seconds. A busy worker "
        "commits less often with more events each (a commit's cost is mostly fixed); one with CPU to spare "
        "keeps the short wait. 0: never stretch.",
    )
    shutdown_timeout_s: float = _opt(
        30.0,
        "Most seconds a stopping worker spends committing what it holds; past it (a call to a dependency "
        "hangs: a failing one is given up at once) it leaves without committing, and the partitions' next "
        "owner re-reads those records.",
    )
    flush_commit_budget: int = _opt(
        4,
        "Commits in flight at once across worlds. Due worlds take turns within it (the one whose "
        "oldest buffered event waited longest first) while the others' batches grow; W busy worlds "
        "with commits of c seconds each flush every W x c / budget seconds.",
    )
    dedupe_ttl_s: int = _opt(
        7 * 24 * 3600,
        "How long dead-letter decisions, the DLQ redrive ledger and replay checkpoints are kept in Redis.",
    )
    dedupe_window_s: int = _opt(
        3600,
        "How long an applied event id is marked in Redis (marks live window to 1.5 x window). It must "
        "cover producer retries and redeliveries; an older duplicate is caught by the branch's event log at "
        "commit time. Redis memory = rate x 1.5 x window x bytes per mark (docs/architecture.md).",
    )
    dedupe_mark_buckets: int = _opt(
        1024,
        "Mark buckets per world per half window. Keep about 100 marks per bucket: "
        "buckets >= events/s per world x window / 200 (a fuller bucket costs memory, never correctness).",
    )
    dedupe_read_per_event_marks: bool = _opt(
        True,
        "Also read the one-key-per-event marks of the previous format (causeway:applied:{<world>}:<id>, "
        "7-day TTL), while a scan of Redis finds any key of the old formats (every "
        "dedupe_old_marks_recheck_s). Turn off 7 days after upgrading.",
    )
    dedupe_read_legacy_marks: bool = _opt(
        True,
        "Also read marks of the key format before the world hash tag (causeway:applied:<world>:<id>). "
        "Read like dedupe_read_per_event_marks. Turn off 7 days after upgrading, and on Redis Cluster "
        "(those keys span slots).",
    )
    dedupe_old_marks_recheck_s: float = _opt(
        3600.0,
        "Seconds between a worker's scans for keys of the old per-event mark formats (SCAN, 1,000 keys "
        "a call). While the last scan found none, the lookups skip them (two keys an id); a duplicate "
        "a skipped mark would have caught is caught by the branch's event log at commit time. 0: no "
        "scan, read them always.",
    )
    causal_timeout_s: float = _opt(
        300.0,
        "A parked event waits this long for its cause, then dead-letters "
        "(wall time, and read time while the worker is behind).",
    )
    max_parked: int = _opt(100_000, "Parked events held in memory before the worker applies backpressure.")
    max_unacked_records: int = _opt(
        100_000,
        "Consumed records held until their offsets can be acked (an older record still parked or committing "
        "holds back its partition's later ones) before the worker pauses the partitions read ahead in record "
        "time; at twice this it pauses all of them. Bounds memory when the worker falls behind: a 5,000/s "
        "soak held up to 310k records (RSS up to 1.76 GiB) without it. A committed record keeps only its place "
        "in the ack queue; its bytes go with its commit.",
    )
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
    log_merge_max_rows: int = _opt(
        100_000,
        "Rows one merge of the event log's small files may hold. Bounds the transient Arrow tables a commit "
        "makes, which the allocator keeps: lower means less memory, and log files that stop growing at half "
        "of it, so an entity's audit trail opens more of them.",
    )
    log_merge_max_bytes: int = _opt(
        64 * 1024 * 1024,
        "In-memory bytes of rows (at the flush's row size) one merge of the event log's small files may hold: "
        "CAUSEWAY_LOG_MERGE_MAX_ROWS for wide rows.",
    )
    index_cache_bytes: int = _opt(
        256 * 1024 * 1024,
        "Bytes of parsed projection key columns (the worker's key index, one entry per data file, so per "
        "bucket) kept between flushes, least recently used evicted first. Bounds the worker's memory as keys "
        "grow; an evicted file is read again from storage when a flush touches its bucket. Up to half of it holds "
        "the data files' key filters (5-10 bytes a key, which key columns never evict). Up to a quarter more "
        "holds every column of the small files the flushes wrote, which the small-file merge reads back.",
    )
    index_cache_idle_s: float = _opt(
        120.0,
        "Key columns and kept rows in CAUSEWAY_INDEX_CACHE_BYTES that no flush used for this long are dropped "
        "before the bound is reached (0: only the bound evicts). A table that keeps growing leaves most of its "
        "files' keys untouched; without it they stay until the bound, and the worker's memory follows the "
        "table's history. A world idle for longer re-reads its files' key columns on its next flush.",
    )
    key_filter_spill_bytes: int = _opt(
        1024 * 1024 * 1024,
        "Bytes of local disk (under CAUSEWAY_DATA_DIR/key-filters, one directory per worker, removed when it "
        "stops) that hold the key filters evicted from memory: an evicted filter is read back (5-10 bytes a key) "
        "instead of rebuilt from its file's key column. 0: none, an evicted filter is rebuilt.",
    )
    memory_pool: str = _opt(
        "jemalloc",
        "The memory pool of pyarrow's calls in the worker (the Arrow tables causeway builds, merges and "
        "caches): jemalloc (Arrow's bundled one, its freed pages purged at once: JE_ARROW_MALLOC_CONF, below), "
        "default (pyarrow's choice, mimalloc), system (glibc malloc, which CAUSEWAY_MEMORY_RELEASE_INTERVAL_S "
        "trims) or mimalloc. Arrow's C++ code has its own: CAUSEWAY_ARROW_CPP_POOL. Set once at start-up.",
    )
    arrow_cpp_pool: str = _opt(
        ARROW_CPP_POOL_DEFAULT,
        "The memory pool of Arrow's C++ code in causeway's processes (the Parquet writer and reader, compute "
        "kernels), set as ARROW_DEFAULT_MEMORY_POOL before pyarrow loads (an operator's own value of that is "
        "kept): default (pyarrow's choice, mimalloc), jemalloc, system or mimalloc. jemalloc: a 30-minute soak "
        "at 5,000/s grew 1.21x (366 -> 443 MiB) against 1.30x, but two pairs of the full profile read "
        "7.4-7.9k against 11.7-12.5k events/s with a higher peak (docs/benchmarks.md, 2026-12-03 noon).",
    )
    malloc_arena_max: int = _opt(
        0,
        "Most glibc malloc arenas the worker's threads spread over (0: glibc's default, 8 per core). Fewer "
        "arenas keep less freed memory per commit thread and make the threads share locks; set once at start-up.",
    )
    native_work_bytes: int = _opt(
        0,
        "Bytes of transient Arrow tables the worker's log merges may hold at once across worlds (three times a "
        "merge's in-memory rows); a merge that does not fit waits for the others, one larger than this runs "
        "alone. 0: no bound. At 64 MiB a 4-minute soak's merges ran one at a time and Arrow's peak fell by a "
        "third, but RSS did not (docs/benchmarks.md, 2026-12-02 morning), so it is off by default.",
    )
    memory_release_interval_s: float = _opt(
        30.0,
        "Every this many seconds the worker hands back to the OS what Arrow's pool and glibc malloc keep "
        "free (malloc_trim: 2-5 ms of CPU); 0 never.",
    )
    projection_buckets: int = _opt(
        0,
        "Buckets of the key in a new projection table's layout (identity(type), bucket(N, pk); 0 = type only). "
        "A flush writes a file per (type, bucket) it touches: buckets cut the bytes a few-key read scans, but "
        "random keys then write N times the files per flush (about twice the commit latency at N = 4, "
        "docs/architecture.md 'Table layout'). Existing tables change only by `causeway tables evolve`.",
    )
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
    reconcile_worlds: str = _opt(
        "served",
        "Which worlds the reconciliation timer (and `causeway reconcile` without --world) covers: comma-separated "
        "world ids or glob patterns (`team-a-*`, `*` = every branch in Nessie), and `served` = the worlds this "
        "worker has applied events for since it started (the CLI has none). Bounds the reconciliation series too.",
    )
    # --- CDC ingest (agents/cdc.py, docs/cdc.md) --------------------------------------------------
    cdc_mapping: str = _opt(
        "",
        "CDC mapping: a YAML/JSON file path or the JSON itself. Set, the worker also runs the Debezium "
        "ingest; empty, it does not.",
    )
    cdc_pattern: str = _opt(
        r"^cdc\.raw\..*",
        "Regex of the raw Debezium topics the ingest subscribes. On a shared broker narrow it to your "
        r"sources (^cdc\.raw\.erp\..*): every matching topic without a mapping is dead-lettered.",
    )
    cdc_group_id: str = _opt("", "Consumer group of the CDC ingest; empty means the app id + '-cdc'.")
    cdc_metadata_max_age_ms: int = _opt(
        5_000, "A cdc.raw.* topic created after start-up is picked up within this time (Kafka's default: 5 min)."
    )
    cdc_max_records: int = _opt(5_000, "Raw records per ingest batch (one produce round and one offset commit).")
    cdc_poll_timeout_ms: int = _opt(500, "How long the ingest's poll waits when there is nothing to read.")
    cdc_linger_ms: int = _opt(5, "Producer batching delay of the ingest; higher batches more, adds latency.")
    cdc_dlq_max_value_bytes: int = _opt(
        900_000,
        "A rejected raw value larger than this is dead-lettered without its bytes (headers say where to "
        "re-read it); keeps dead letters under the DLQ topic's size limit.",
    )
    cdc_retry_backoff_s: float = _opt(1.0, "Pause before the ingest re-reads a batch whose produce failed.")
    cdc_ensure_topics: bool = _opt(True, "The ingest creates the change and DLQ topics if missing.")
    cdc_log_interval_s: float = _opt(
        60.0, "The ingest logs its skipped / rejected / failed counters at most this often (0: never)."
    )
    # --- observability ---------------------------------------------------------------------------
    web_port: int = _opt(6066, "Worker HTTP port: /metrics and /health.")
    web_bind: str = _opt(
        "127.0.0.1", "Address the worker's HTTP server binds (0.0.0.0 in a container, so Prometheus reaches it)."
    )
    prometheus_sd_dir: str = _opt(
        "./.causeway/run/prometheus-sd",
        "Folder of Prometheus file-based service discovery: each worker and lag exporter writes its scrape "
        "target there while it runs and removes it on exit. Empty disables it.",
    )
    lag_exporter_port: int = _opt(
        6065, "Port of the standalone lag exporter's /metrics (python -m monitoring.lag_exporter)."
    )
    lag_groups: str = _opt("", "Consumer groups the lag exporter watches, comma-separated; empty means the app id.")
    lag_topics: str = _opt(
        "",
        "Topics the lag exporter always watches (besides those the group has committed), comma-separated; "
        "empty means the objects and links topics.",
    )
    lag_poll_interval_s: float = _opt(5.0, "How often the lag exporter asks the broker for offsets, seconds.")
    log_level: str = _opt("info", "Log level: debug, info, warning, error.")
    # --- world manager gRPC API (api/, `causeway serve`) -----------------------------------------
    api_bind: str = _opt("127.0.0.1:50051", "Address `causeway serve` listens on (host:port).")
    api_url: str = _opt(
        "", "Where the CLI's world commands and api.client reach the API (host:port); empty: call Nessie directly."
    )
    api_token: Secret = _opt(Secret(""), "Bearer token the CLI and api.client send to the API. Never logged.")
    api_tokens_file: str = _opt(
        "./.causeway/api-tokens", "The server's token file: one `name role sha256-hex` per line (`causeway api-token`)."
    )
    api_tls_cert: str = _opt("", "PEM certificate chain for the API server; set with the key to serve TLS only.")
    api_tls_key: str = _opt("", "PEM private key for the API server's certificate.")
    api_tls_ca: str = _opt("", "PEM CA bundle the client trusts for the API; set it to connect over TLS.")
    api_audit_log: str = _opt(
        "./.causeway/run/api-audit.jsonl", "Append-only JSON-lines audit log of every mutating API call."
    )
    api_redis_prefix: str = _opt("causeway:api", "Redis key prefix of the API's idempotency locks and results.")
    api_idempotency_ttl_s: int = _opt(7 * 24 * 3600, "How long an action's stored outcome answers a repeat.")
    api_lock_lease_s: float = _opt(
        30.0, "Lease of an idempotency lock; renewed while the action runs. A crashed holder's lock frees after this."
    )
    api_inflight_wait_s: float = _opt(
        20.0, "A call whose key is in flight elsewhere waits this long for the outcome, then gets UNAVAILABLE."
    )
    api_apply_deadline_s: float = _opt(30.0, "ApplyChanges waits this long for its events to commit by default.")
    # --- write-audit-publish gate ----------------------------------------------------------------
    publish_log_branch: str = _opt(
        "causeway-publish-log", "Nessie branch holding the publish gate's audit log (one commit per entry)."
    )
    publish_max_drift: int = _opt(10, "Publish audit: most commits the target may be ahead of the merge base.")
    publish_max_tables: int = _opt(25, "Publish audit: most tables one publish may modify.")
    publish_max_changed_entities: int = _opt(0, "Publish audit: most entities one publish may change (0: no limit).")
    publish_webhook_url: Secret = _opt(
        Secret(""), "Slack-compatible webhook called on publish success, decline, block and failure; empty: none."
    )
    publish_audit_interval_s: float = _opt(
        0.0, "Worker timer auditing worlds for drift and staleness every this many seconds (0: off)."
    )
    publish_audit_min_age_s: float = _opt(
        86_400.0, "The drift timer audits worlds with a pending plan or whose branch is older than this."
    )

    def __post_init__(self) -> None:
        # A secret given as a plain str (``Settings(redis_url="redis://:pw@h")``) still prints masked.
        for f in dataclasses.fields(self):
            kind = type(f.default)
            value = getattr(self, f.name)
            if issubclass(kind, Secret) and isinstance(value, str) and type(value) is not kind:
                object.__setattr__(self, f.name, kind(str.__str__(value)))

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
        if self.kafka_security_protocol.upper() not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise SettingsError(
                f"{env_name('kafka_security_protocol')}={self.kafka_security_protocol!r}: "
                "use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
            )
        if self.kafka_security_protocol.upper().startswith("SASL_") and self.kafka_sasl_mechanism.upper() not in (
            "PLAIN",
            "SCRAM-SHA-256",
            "SCRAM-SHA-512",
            "OAUTHBEARER",
        ):
            raise SettingsError(
                f"{env_name('kafka_sasl_mechanism')}={self.kafka_sasl_mechanism!r}: "
                "use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"
            )
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise SettingsError(f"{env_name('redis_url')}={self.redis_url}: use redis://, rediss:// or unix://")
        for name in (
            "batch_max_events",
            "batch_flush_events",
            "topic_partitions",
            "max_parked",
            "max_unacked_records",
            "commit_retries",
            "cdc_max_records",
            "log_merge_max_rows",
            "log_merge_max_bytes",
            "intake_fetch_min_bytes",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{env_name(name)} must be at least 1")
        for name in ("index_cache_bytes", "key_filter_spill_bytes", "native_work_bytes", "intake_fetch_wait_ms"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{env_name(name)} must be 0 or more")
        for name in ("batch_idle_min_seconds", "index_cache_idle_s"):
            if not 0.0 <= getattr(self, name) < math.inf:
                raise SettingsError(f"{env_name(name)}={getattr(self, name)}: use 0 or more seconds")
        if not 0.0 <= self.batch_busy_cpu < math.inf:
            raise SettingsError(f"{env_name('batch_busy_cpu')}={self.batch_busy_cpu}: use 0 (off) or a share of a core")
        _check_memory(self)
        try:
            re.compile(self.cdc_pattern)
        except re.error as exc:
            raise SettingsError(f"{env_name('cdc_pattern')}={self.cdc_pattern!r} is not a valid regex: {exc}") from None
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


def _check_memory(s: Settings) -> None:
    """The allocator knobs are applied once when a worker starts (streams/memory.py); a bad one
    fails here, with every other bad setting, not in the worker's start-up alone."""
    for name in ("memory_pool", "arrow_cpp_pool"):
        if getattr(s, name) not in MEMORY_POOLS:
            raise SettingsError(f"{env_name(name)}={getattr(s, name)!r}: use one of {', '.join(MEMORY_POOLS)}")
    if not 0 <= s.malloc_arena_max <= MAX_MALLOC_ARENAS:
        raise SettingsError(
            f"{env_name('malloc_arena_max')}={s.malloc_arena_max}: use 0 (glibc's default) "
            f"or a number of arenas up to {MAX_MALLOC_ARENAS}"
        )
    interval = s.memory_release_interval_s
    # The releaser's wait refuses inf, nan and anything past TIMEOUT_MAX, and its thread would die
    # unseen; a negative interval would silently mean "never".
    if not (math.isfinite(interval) and 0 <= interval <= threading.TIMEOUT_MAX):
        raise SettingsError(
            f"{env_name('memory_release_interval_s')}={interval!r}: use 0 (never) or a number of seconds "
            f"up to {threading.TIMEOUT_MAX:.0f}"
        )


def env_name(field_name: str) -> str:
    return "CAUSEWAY_" + field_name.upper()


def _coerce(f: dataclasses.Field[Any], raw: str) -> Any:
    kind: type[Any] = type(f.default)
    try:
        if kind is bool:
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if kind is int:
            return int(raw.replace("_", ""))
        if kind is float:
            return float(raw)
        if issubclass(kind, Secret):
            return kind(raw)
        return raw
    except ValueError as exc:
        raise SettingsError(f"{env_name(f.name)}={raw!r} is not a valid {kind.__name__}") from exc


def markdown_table() -> str:
    """The README's configuration table."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(Settings):
        default = "" if type(f.default) is Secret else f.default
        rows.append(f"| `{env_name(f.name)}` | `{default}` | {f.metadata['help']} |")
    return "\n".join(rows)
