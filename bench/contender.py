"""What the naive and ceiling contenders share: config, the Kafka loop's plumbing, stats and commits.

Each contender runs as its own process (``python -m bench.naive CONFIG`` / ``python -m bench.ceiling
CONFIG``) so the harness measures its memory and CPU exactly as it measures causeway's workers. It
consumes the run's change topics in its own consumer group, writes to its own branches (one per
world, created by the harness) and warehouse, and commits Kafka offsets after each Nessie commit, so
"drained" is read from the broker in the same way for every contender. Commits carry the same
properties as causeway's (``causeway.batch_id``, ``causeway.event_count`` and
``causeway.offsets.<topic>/<partition>``), which is how the harness maps each record to the commit
that made it visible.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update.snapshot import ExpireSnapshots

from sinks.catalog import NessieCatalog
from sinks.committed_offsets import format_ranges, tp_name
from sinks.committer import PROP_BATCH, PROP_COUNT, PROP_OFFSETS, PROP_WORLD
from sinks.nessie import SyncNessieClient
from sinks.tables import TableDef, create_table
from streams.security import kafka_client_options
from streams.settings import Settings, mask_url


@dataclass(frozen=True)
class ContenderConfig:
    """Written as JSON by the harness, read by the contender process."""

    name: str
    bootstrap: str
    topics: list[str]  # [objects topic, links topic]
    group: str
    branches: dict[str, str]  # world id -> branch
    warehouse: str
    stats_path: str
    namespace: str = "onto"
    batch_size: int = 10  # naive: events per commit; ceiling: records per getmany
    poll_ms: int = 200
    redis_url: str = "redis://127.0.0.1:6379/0"  # shown masked; the contender connects with CAUSEWAY_REDIS_URL
    redis_prefix: str = "processed:"
    causal_retry_s: float = 0.1
    causal_timeout_s: float = 60.0
    max_retries: int = 3
    expire_every: int = 20
    target_file_bytes: int = 64 * 1024 * 1024

    @classmethod
    def load(cls, path: str) -> ContenderConfig:
        return cls(**json.loads(Path(path).read_text()))

    def dump(self, path: Path) -> None:
        """Write the config; a URL's credentials are masked (the process reads secrets from its environment)."""
        shown = {k: mask_url(v) if isinstance(v, str) and "://" in v else v for k, v in asdict(self).items()}
        path.write_text(json.dumps(shown, indent=2))


@dataclass
class Stats:
    """Counters a contender reports; the harness reads the file after stopping the process."""

    commits: int = 0
    conflicts: int = 0
    commit_seconds: list[float] = field(default_factory=list)
    events_committed: int = 0
    bad: int = 0
    duplicates: int = 0
    deferred: int = 0
    expired: int = 0
    redis_calls: int = 0

    def summary(self) -> dict[str, Any]:
        secs = sorted(self.commit_seconds)
        out = {k: v for k, v in asdict(self).items() if k != "commit_seconds"}
        out["commit_seconds"] = quantiles_summary(secs)
        out["commit_seconds_raw"] = [round(x, 4) for x in self.commit_seconds]
        return out


def quantiles_summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def q(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))], 4)

    return {
        "count": len(ordered),
        "mean": round(statistics.fmean(ordered), 4),
        "p50": q(0.5),
        "p95": q(0.95),
        "p99": q(0.99),
        "max": round(ordered[-1], 4),
    }


def commit_properties(world: str, batch_id: str, offsets: Mapping[tuple[str, int], list[int]]) -> dict[str, str]:
    props = {PROP_WORLD: world, PROP_BATCH: batch_id, PROP_COUNT: str(sum(len(v) for v in offsets.values()))}
    for tp, offs in sorted(offsets.items()):
        props[PROP_OFFSETS + tp_name(tp)] = format_ranges(offs)
    return props


def load_or_create(
    cat: NessieCatalog, namespace: str, tdef: TableDef, *, projection_buckets: int, target_file_bytes: int
) -> Table:
    """The contender's table, created as causeway's writers create it (``sinks.tables.create_table``):
    the layout of ``projection_buckets`` (``Settings.projection_buckets``) with its sort order, so a
    comparison with causeway's worker compares the same tables."""
    try:
        return cat.load_table((namespace, tdef.name))
    except NoSuchTableError:
        return create_table(cat, namespace, tdef, projection_buckets, target_file_bytes)


def expire_old_snapshots(tx: Transaction, keep_below: int) -> None:
    """Keep metadata bounded the way causeway does (the field notes: commit cost grows otherwise)."""
    metadata = tx.table_metadata
    if len(metadata.snapshots) <= keep_below:
        return
    protected = {ref.snapshot_id for ref in metadata.refs.values()}
    old = [s.snapshot_id for s in metadata.snapshots if s.snapshot_id not in protected]
    if old:
        ExpireSnapshots(tx).by_ids(old).commit()


class Contender:
    """The Kafka loop's frame: consumer, catalogs, offsets committed after Nessie, stats on exit."""

    def __init__(self, cfg: ContenderConfig) -> None:
        self.cfg = cfg
        self.stats = Stats()
        self.stopping = asyncio.Event()
        self.settings = Settings.from_env(warehouse=cfg.warehouse, namespace=cfg.namespace)
        self.client = SyncNessieClient.from_settings(self.settings)
        first = next(iter(cfg.branches.values()))
        self._template = NessieCatalog.from_settings(self.settings, first, client=self.client)
        self.consumer = AIOKafkaConsumer(
            *cfg.topics,
            bootstrap_servers=cfg.bootstrap,
            group_id=cfg.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            **kafka_client_options(self.settings),
        )
        self._last_dump = 0.0

    def catalog(self, world: str) -> NessieCatalog:
        return self._template.at(self.cfg.branches[world])

    def kind_of(self, topic: str) -> str:
        return "object" if topic == self.cfg.topics[0] else "link"

    async def commit_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        if offsets:
            await self.consumer.commit({TopicPartition(t, p): o for (t, p), o in offsets.items()})

    def dump_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_dump > 2.0:
            self._last_dump = now
            tmp = Path(self.cfg.stats_path + ".tmp")
            tmp.write_text(json.dumps(self.stats.summary()))
            tmp.replace(self.cfg.stats_path)

    async def loop(self) -> None:
        raise NotImplementedError

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        await self.consumer.start()
        try:
            await self.loop()
        finally:
            self.dump_stats(force=True)
            await self.consumer.stop()
            self.client.close()
