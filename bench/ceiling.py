"""The ceiling contender: what this machine allows between Kafka and an Iceberg table on Nessie.

    python -m bench.ceiling CONFIG.json    (started by the harness; SIGTERM stops it)

aiokafka ``getmany`` (up to ``batch_size`` records) → ``orjson.loads`` → columns → one Arrow table
per world → one Iceberg append to that world's ``entity_events`` (causeway's log schema, so the
bytes compare) through causeway's Nessie catalog → one Nessie commit per world per batch → Kafka
offsets. No validation beyond "is a JSON object with a world", no dedupe, no causal order, no
projections, no Redis. Old snapshots are expired like causeway does, so commit cost stays flat.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa

from bench.contender import Contender, ContenderConfig, commit_properties, expire_old_snapshots, load_or_create
from models.events import parse_timestamp_ms
from sinks.tables import EVENTS

_STR_FIELDS = ("event_id", "world_id", "change_type", "caused_by", "source", "from_pk", "to_pk")


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _ms(value: Any) -> int:
    try:
        return parse_timestamp_ms(value)
    except Exception:  # noqa: BLE001 - the ceiling does not validate; a bad time becomes 0
        return 0


class Ceiling(Contender):
    def __init__(self, cfg: ContenderConfig) -> None:
        super().__init__(cfg)
        self.seq = 0
        self.schema = EVENTS.arrow_schema

    def to_arrow(self, rows: list[tuple[str, int, int, dict[str, Any]]], batch_id: str, now: datetime) -> pa.Table:
        n = len(rows)
        docs = [d for *_, d in rows]
        cols: dict[str, Any] = {f: [d.get(f) for d in docs] for f in _STR_FIELDS}
        cols["kind"] = [self.kind_of(t) for t, *_ in rows]
        cols["entity_type"] = [d.get("object_type") or d.get("link_type") or "" for d in docs]
        cols["entity_pk"] = [d.get("object_pk") or d.get("link_pk") or "" for d in docs]
        cols["version"] = [int(d.get("version") or 0) for d in docs]
        cols["before_properties"] = [_json(d.get("before_properties")) for d in docs]
        cols["after_properties"] = [_json(d.get("after_properties")) for d in docs]
        cols["causal_order"] = [d.get("causal_order") for d in docs]
        cols["occurred_at"] = (
            pa.array([_ms(d.get("occurred_at")) for d in docs], pa.int64())
            .cast(pa.timestamp("ms", tz="UTC"))
            .cast(pa.timestamp("us", tz="UTC"))
        )
        cols["committed_at"] = pa.array([now] * n, self.schema.field("committed_at").type)
        cols["batch_id"] = [batch_id] * n
        cols["schema_version"] = [int(d.get("schema_version") or 0) for d in docs]
        cols["source_topic"] = [t for t, *_ in rows]
        cols["source_partition"] = [p for _, p, _, _ in rows]
        cols["source_offset"] = [o for _, _, o, _ in rows]
        cols["applied"] = [True] * n
        cols["batch_seq"] = pa.array(range(n), pa.int32())
        return pa.table(cols, schema=self.schema)

    def _commit(self, world: str, rows: list[tuple[str, int, int, dict[str, Any]]]) -> None:
        self.seq += 1
        batch_id = f"ceiling-{uuid.uuid4().hex[:8]}-{self.seq}"
        offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
        for t, p, o, _ in rows:
            offsets[(t, p)].append(o)
        cat = self.catalog(world)
        cat.begin()
        try:
            table = load_or_create(
                cat,
                self.cfg.namespace,
                EVENTS,
                projection_buckets=self.settings.projection_buckets,
                target_file_bytes=self.cfg.target_file_bytes,
            )
            tx = table.transaction()
            tx.append(self.to_arrow(rows, batch_id, datetime.now(UTC)))
            expire_old_snapshots(tx, self.cfg.expire_every)
            tx.commit_transaction()
            cat.publish(f"ceiling: world {world} batch {batch_id}", commit_properties(world, batch_id, offsets))
        finally:
            cat.discard()

    def _process(self, batch: dict[Any, list[Any]]) -> dict[tuple[str, int], int]:
        by_world: dict[str, list[tuple[str, int, int, dict[str, Any]]]] = defaultdict(list)
        offsets: dict[tuple[str, int], int] = {}
        for tp, records in batch.items():
            for rec in records:
                try:
                    doc = orjson.loads(rec.value)
                except orjson.JSONDecodeError:
                    doc = None
                ok = isinstance(doc, dict) and isinstance(doc.get("event_id"), str) and doc.get("change_type")
                world = doc.get("world_id") if ok else None
                if world in self.cfg.branches:
                    by_world[world].append((tp.topic, tp.partition, rec.offset, doc))
                else:
                    self.stats.bad += 1
            offsets[(tp.topic, tp.partition)] = records[-1].offset + 1
        for world, rows in by_world.items():
            started = time.monotonic()
            self._commit(world, rows)
            self.stats.commit_seconds.append(time.monotonic() - started)
            self.stats.commits += 1
            self.stats.events_committed += len(rows)
        return offsets

    async def loop(self) -> None:
        while not self.stopping.is_set():
            batch = await self.consumer.getmany(timeout_ms=self.cfg.poll_ms, max_records=self.cfg.batch_size)
            if not batch:
                continue
            offsets = await asyncio.to_thread(self._process, batch)
            await self.commit_offsets(offsets)
            self.dump_stats()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cfg = ContenderConfig.load(args[0])

    async def run() -> None:
        await Ceiling(cfg).main()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
