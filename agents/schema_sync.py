"""Schema sync: ``schema.updated`` control events → Iceberg schema evolution on each world branch.

For one change of one type in one world, :class:`SchemaStore` does, in **one Nessie commit**
(catalog staging, expected hash = the head it read):

1. load the projection table (``entity_common`` / ``entity_edge``) and the applied contract of the
   type (table property ``causeway.schema.<type>``) at the head;
2. :func:`models.schema.decide`: a version at or below the applied one is a duplicate (nothing is
   committed: idempotent), one above it applies, a gap waits; an incompatible change is refused;
3. Iceberg schema evolution through pyiceberg ``update_schema`` — ``add_column`` (optional),
   ``rename_column`` (by field id, so old files read under the new name), ``update_column`` for a
   widening (int→long, float→double, decimal precision up) and for docs — metadata only, no data
   file is rewritten; the new contract is stored as the table property in the same metadata;
4. *backfill* of added columns: rows of the type whose JSON ``properties`` already carry the new
   property (events that arrived before the schema) get the typed value, merge-on-read (new rows
   plus a position-delete file, only rows that gain a value), so the column is never seen
   half-filled;
5. publish; a conflict (the worker committed meanwhile) reloads and decides again; an unknown
   outcome is settled from the branch history (``causeway.batch_id = schema:<change_id>``).

:class:`SchemaSync` is the agent: an aiokafka loop (own group ``<app_id>-schema``) that applies
changes in version order per ``(world, kind, type)`` — a change that arrives before its
predecessor is held in memory and its offset is not committed until it is applied (a restart
re-reads it) — answers every handled change on ``storage.schema.updated``, dead-letters refused
ones with the reason, and exports the version vector (control, data, intelligence) per world.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from agents import layout_events
from agents.kafka_loop import KafkaLoop
from agents.offset_tracker import OffsetTracker
from models.deadletter import DeadLetter
from models.events import EntityKind, Invalid
from models.schema import (
    ALL_WORLDS,
    AddColumn,
    Decision,
    SchemaChange,
    SchemaRefused,
    StorageSchemaUpdated,
    TypeSchema,
    Verdict,
    VersionVector,
    decide,
    decode_change,
)
from models.worlds import WorldNaming
from monitoring.metrics import Metrics
from sinks.catalog import NessieCatalog
from sinks.committer import PROP_BATCH, PROP_WORLD, BatchCommitter, read_rows, stage_replacement
from sinks.errors import BranchMissing, NessieConflict
from sinks.rows import property_value
from sinks.tables import TableDef, contracts, evolve, projection_for, schema_property
from streams.security import kafka_client_options
from streams.settings import Settings
from streams.topics import ensure_topics
from worlds.manager import world_ids

log = logging.getLogger(__name__)

PROP_SCHEMA_CHANGE = "causeway.schema.change_id"
PROP_SCHEMA_TYPE = "causeway.schema.type"
PROP_SCHEMA_VERSION = "causeway.schema.version"


@dataclass(frozen=True)
class SyncResult:
    """How one change went on one world branch."""

    world_id: str
    verdict: str  # applied | duplicate | waiting | refused
    schema: TypeSchema  # the type's contract on the branch afterwards
    commit: str | None = None
    reason: str | None = None
    detail: str | None = None
    backfilled: int = 0
    attempts: int = 1


class SchemaStore:
    """Applies schema changes to world branches; blocking (pyiceberg), call it from a thread."""

    def __init__(self, settings: Settings, committer: BatchCommitter | None = None) -> None:
        self.settings = settings
        self.committer = committer or BatchCommitter(settings)
        self.naming = WorldNaming(settings.prod_world, settings.main_branch)

    def worlds(self) -> list[str]:
        """Every world that has a branch (what ``world_id = "*"`` means when it is applied)."""
        return world_ids(self.committer.occ.client.list_references(), self.naming)

    def contracts(self, world_id: str) -> dict[tuple[EntityKind, str], TypeSchema]:
        """The contracts applied on a world's branch head, by (kind, type)."""
        cat = self.committer.occ.catalog(self.naming.branch(world_id))
        out: dict[tuple[EntityKind, str], TypeSchema] = {}
        for kind in EntityKind:
            tdef = projection_for(kind)
            try:
                table = cat.load_table((self.settings.namespace, tdef.name))
            except Exception:  # noqa: BLE001 - no table yet (or no branch): nothing applied
                continue
            for name, ts in contracts(table.metadata.properties).items():
                out[(kind, name)] = ts
        return out

    def apply(self, change: SchemaChange) -> SyncResult:
        """Apply ``change`` (one concrete world) in one Nessie commit, retrying conflicts."""
        assert change.world_id != ALL_WORLDS
        world = change.world_id
        branch = self.naming.branch(world)
        batch_id = f"schema:{change.change_id}"

        def attempt(cat: NessieCatalog, base: str, n: int) -> SyncResult:
            return self._attempt(cat, change, batch_id, n)

        try:
            return self.committer.occ.run(
                branch,
                attempt,
                what=f"schema change {change.change_id} on {branch}",
                commit_id=batch_id,
                landed=lambda found, attempts: self._landed(change, found, attempts),
            )
        except BranchMissing:
            empty = TypeSchema(change.kind, change.type_name)
            return SyncResult(world, "refused", empty, None, "unknown-world", f"world {world} has no branch")

    def _landed(self, change: SchemaChange, commit: str, attempts: int) -> SyncResult:
        schema = self.contracts(change.world_id).get((change.kind, change.type_name))
        assert schema is not None
        return SyncResult(change.world_id, "applied", schema, commit, attempts=attempts)

    def _attempt(self, cat: NessieCatalog, change: SchemaChange, batch_id: str, attempt: int) -> SyncResult:
        tdef = projection_for(change.kind)
        table = self.committer.load_or_create(cat, tdef)
        current = contracts(table.metadata.properties).get(change.type_name)
        try:
            decision = decide(current, change)
            if decision.verdict is Verdict.APPLY:
                check_columns(set(table.schema().column_names), decision)
        except SchemaRefused as exc:
            schema = current or TypeSchema(change.kind, change.type_name)
            return SyncResult(change.world_id, "refused", schema, None, exc.reason, exc.detail, attempts=attempt)
        if decision.verdict is not Verdict.APPLY:
            return SyncResult(change.world_id, decision.verdict.value, decision.schema, attempts=attempt)

        tx = table.transaction()
        with tx.update_schema() as update:
            evolve(update, decision.ops)
        tx.set_properties({schema_property(change.type_name): decision.schema.to_json()})
        tx.commit_transaction()
        backfilled = self._backfill(cat, tdef, decision, batch_id)
        published = cat.publish(
            f"causeway: schema {change.kind.value} {change.type_name} v{change.version} ({change.change_id})",
            {
                PROP_WORLD: change.world_id,
                PROP_BATCH: batch_id,
                PROP_SCHEMA_CHANGE: change.change_id,
                PROP_SCHEMA_TYPE: f"{change.kind.value}:{change.type_name}",
                PROP_SCHEMA_VERSION: str(change.version),
            },
        )
        return SyncResult(
            change.world_id, "applied", decision.schema, published.hash, backfilled=backfilled, attempts=attempt
        )

    def _backfill(self, cat: NessieCatalog, tdef: TableDef, decision: Decision, batch_id: str) -> int:
        """Fill added columns from the JSON of rows written before the schema; returns rows rewritten."""
        added = [op.property for op in decision.ops if isinstance(op, AddColumn)]
        if not added:
            return 0
        table = cat.load_table((self.settings.namespace, tdef.name))  # the staged, evolved table
        type_col = tdef.key[0]
        type_name = decision.schema.type_name
        rows = read_rows(
            table,
            tdef,
            lambda t: pc.and_(pc.equal(t.column(type_col), type_name), pc.invert(t.column("deleted"))),
            self.committer.file_cache,
        )
        if rows is None or not rows.num_rows:
            return 0
        props = [orjson.loads(p) if p else {} for p in rows.column("properties").to_pylist()]
        values = {p.column(type_name): [property_value(d, p) for d in props] for p in added}
        keep = [any(v[i] is not None for v in values.values()) for i in range(rows.num_rows)]
        if not any(keep):
            return 0
        mask = pa.array(keep)
        chosen = rows.filter(mask)
        schema = table.schema().as_arrow()
        for col, vals in values.items():
            kept = [v for v, k in zip(vals, keep, strict=True) if k]
            chosen = chosen.set_column(chosen.schema.get_field_index(col), col, pa.array(kept, schema.field(col).type))
        deletes: dict[str, list[int]] = {}
        for path, pos in zip(chosen.column("_file").to_pylist(), chosen.column("_pos").to_pylist(), strict=True):
            deletes.setdefault(path, []).append(pos)
        tx = table.transaction()
        stage_replacement(tx, table, chosen.select(schema.names).cast(schema), deletes, {"causeway.batch_id": batch_id})
        tx.commit_transaction()
        return chosen.num_rows


def check_columns(names: set[str], decision: Decision) -> None:
    """Refuse a change whose columns clash with columns the table has but the contract does not map."""
    from models.schema import RenameColumn

    names = set(names)
    for op in decision.ops:
        if isinstance(op, AddColumn):
            if op.column in names:
                raise SchemaRefused("column-conflict", f"the table already has a column {op.column}")
            names.add(op.column)
        elif isinstance(op, RenameColumn):
            if op.new in names:
                raise SchemaRefused("column-conflict", f"cannot rename {op.old}: the table already has {op.new}")
            names.discard(op.old)
            names.add(op.new)


# --- the agent ------------------------------------------------------------------------------------


@dataclass
class _Held:
    """A change being applied to one or more worlds; its offset is done when none remain."""

    change: SchemaChange
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    remaining: set[str] = field(default_factory=set)


class _Revoke(ConsumerRebalanceListener):
    def __init__(self, sync: SchemaSync) -> None:
        self._sync = sync

    async def on_partitions_revoked(self, revoked: Any) -> None:
        async with self._sync._lock:
            self._sync._forget([(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("schema sync assigned %d partitions", len(assigned))
        await self._sync._reread_intelligence([tp for tp in assigned if tp.topic == self._sync.intelligence_topic])


class SchemaSync(KafkaLoop):
    """The schema-sync loop. ``start`` → ``run`` (until ``stop``); or ``async with``."""

    name = "schema sync"
    retry_on = (KafkaError, IllegalStateError, NessieConflict, OSError)

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        store: SchemaStore | None = None,
        *,
        poll_timeout_ms: int = 200,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.store = store or SchemaStore(settings)
        self.poll_timeout_ms = poll_timeout_ms
        self.vectors: dict[str, VersionVector] = {}  # worlds with a branch only
        self._known: set[str] = set()
        self.results: list[SyncResult] = []  # recent results, newest last (bounded; for tests and /health)
        self._pending: dict[tuple[str, EntityKind, str], dict[int, list[_Held]]] = {}
        self._tracker = OffsetTracker()
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None

    @property
    def group_id(self) -> str:
        return f"{self.settings.app_id}-schema"

    @property
    def intelligence_topic(self) -> str:
        return self.settings.schema_intelligence_topic

    async def _reread_intelligence(self, tps: list[KafkaTP]) -> None:
        """Read the acknowledgement topic from its start: the intelligence layer's entry is rebuilt on
        every start (and rebalance) instead of waiting for its next acknowledgement."""
        if tps and self._consumer is not None:
            await self._consumer.seek_to_beginning(*tps)
            log.info("schema sync: re-reading intelligence acknowledgements from the start of %s", tps)

    async def _known_world(self, world: str | None) -> bool:
        """Whether ``world`` has a branch; only such worlds get metric series (a typo must not leave one)."""
        if not world or world == ALL_WORLDS:
            return False
        if world in self.vectors or world in self._known:
            return True
        if world in await asyncio.to_thread(self.store.worlds):
            self._known.add(world)
            return True
        return False

    async def start(self) -> None:
        s = self.settings
        await ensure_topics(s, {s.schema_topic: 1, s.schema_answer_topic: 1, s.schema_intelligence_topic: 1})
        self._producer = AIOKafkaProducer(
            bootstrap_servers=s.kafka_bootstrap, acks="all", enable_idempotence=True, **kafka_client_options(s)
        )
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            **kafka_client_options(s),
        )
        await self._producer.start()
        self._consumer.subscribe([s.schema_topic, s.schema_intelligence_topic], listener=_Revoke(self))
        await self._consumer.start()
        log.info("schema sync started: group %s, topic %s", self.group_id, s.schema_topic)

    async def step(self) -> int:
        """Poll once, handle every record in offset order, commit what is settled."""
        consumer = self._consumer
        if consumer is None:
            return 0
        batches = await consumer.getmany(timeout_ms=self.poll_timeout_ms, max_records=500)
        n = 0
        async with self._lock:
            if self._consumer is None:
                return 0  # stopped while the poll ran
            assigned = consumer.assignment()
            for tp, records in batches.items():
                if tp not in assigned:
                    continue
                for rec in records:
                    try:
                        await self._handle(rec)
                    except Exception as exc:  # noqa: BLE001 - Nessie down, retries exhausted, ...
                        if self._stopping.is_set():
                            raise
                        self._rewind(consumer, tp, rec.offset, exc)
                        await asyncio.sleep(1.0)
                        break
                    n += 1
            commit = {KafkaTP(t, p): off for (t, p), off in self._tracker.committable_all().items()}
            if commit:
                try:
                    await consumer.commit(commit)
                except (CommitFailedError, IllegalStateError) as exc:
                    log.warning("schema sync: offset commit failed after a rebalance: %r", exc)
        return n

    def _rewind(self, consumer: AIOKafkaConsumer, tp: KafkaTP, offset: int, exc: Exception) -> None:
        """A record could not be handled: re-read the partition from its first unsettled offset.

        Everything in memory for the partition (held changes included) is dropped and read again;
        changes already applied come back as duplicates, so re-handling is harmless.
        """
        key = (tp.topic, tp.partition)
        restart = self._tracker.committable(key)
        restart = offset if restart is None else min(restart, offset)
        log.warning("schema sync: %s@%d failed (%r); re-reading from %d", tp, offset, exc, restart)
        self._forget([key])
        consumer.seek(tp, restart)

    def _forget(self, tps: list[tuple[str, int]]) -> None:
        for tp in tps:
            self._tracker.revoke(tp)
        for key, by_version in list(self._pending.items()):
            for version, helds in list(by_version.items()):
                kept = [h for h in helds if (h.topic, h.partition) not in tps]
                if kept:
                    by_version[version] = kept
                else:
                    del by_version[version]
            if not by_version:
                del self._pending[key]

    async def _handle(self, rec: Any) -> None:
        tp = (rec.topic, rec.partition)
        if not self._tracker.consumed(tp, rec.offset):
            return
        if rec.topic == self.settings.schema_intelligence_topic:
            await self._intelligence(rec.value)
            self._tracker.done(tp, rec.offset)
            return
        if layout_events.is_layout_event(rec.value):  # partition evolution (agents/layout_events.py)
            await layout_events.handle(self, rec)
            self._tracker.done(tp, rec.offset)
            return
        change = decode_change(rec.value)
        if isinstance(change, Invalid):
            await self._undecodable(rec, change)
            self._tracker.done(tp, rec.offset)
            return
        worlds = await asyncio.to_thread(self.store.worlds) if change.world_id == ALL_WORLDS else [change.world_id]
        held = _Held(change, rec.topic, rec.partition, rec.offset, rec.key, rec.value, set(worlds))
        for world in sorted(worlds):
            await self._apply(held, world)
        self._settle(held)

    async def _undecodable(self, rec: Any, invalid: Invalid) -> None:
        """A change that did not decode is refused like any other: answer, dead letter, log, metric."""
        world = invalid.world_id
        known = await self._known_world(world)
        world_version = self.vectors[world].versions()["data"] if known and world in self.vectors else 0
        answer = StorageSchemaUpdated.undecodable(
            rec.value, invalid, world_version=world_version, at_ms=int(time.time() * 1000)
        )
        if known and answer.world_id in self.vectors:  # the type's version on the branch, unchanged
            answer = replace(
                answer, version=self.vectors[answer.world_id].data.get(f"{answer.kind}:{answer.type_name}", 0)
            )
        log.warning(
            "schema change %s@%d refused (%s): %s [change_id=%r world=%r]",
            rec.topic, rec.offset, invalid.reason, invalid.detail, answer.change_id, answer.world_id,
        )  # fmt: skip
        await self._send_answer(answer, rec.key)
        await self._dead_letter(rec, invalid.reason, invalid.detail, invalid.event_id, invalid.world_id)
        label = invalid.world_id if known else None  # unknown worlds are counted as "unknown"
        self.metrics.schema_change(label or "unknown", "refused", reason=invalid.reason)

    def _settle(self, held: _Held) -> None:
        if not held.remaining:
            self._tracker.done((held.topic, held.partition), held.offset)

    async def _apply(self, held: _Held, world: str) -> None:
        """Apply ``held`` to ``world``; then any held successor whose gap this closed."""
        queue = [(held, world)]
        while queue:
            item, w = queue.pop(0)
            change = item.change.for_world(w)
            result = await asyncio.to_thread(self.store.apply, change)
            self._record(result)
            if result.reason == "unknown-world":
                # No branch: answer and dead-letter it, but leave no per-world series behind.
                self._known.discard(w)
                self.vectors.pop(w, None)
                item.remaining.discard(w)
                self.metrics.schema_change("unknown", "refused", reason=result.reason)
                await self._answer(change, result, VersionVector(), None)
                await self._dead_letter(item, result.reason, result.detail or "", change.change_id, w)
                log.warning("schema change %s refused for %s: %s", change.change_id, w, result.detail)
                self._settle(item)
                continue
            vector = await self._vector(w)
            type_key = f"{change.kind.value}:{change.type_name}"
            vector.saw_control(type_key, change.version)
            if result.verdict != "refused":
                vector.set_data(type_key, result.schema.version)
            self.metrics.schema_versions(w, vector.versions())  # type: ignore[arg-type]
            if result.verdict == "waiting":
                self.metrics.schema_change(w, "waiting")
                key = (w, change.kind, change.type_name)
                self._pending.setdefault(key, {}).setdefault(change.version, []).append(item)
                continue
            item.remaining.discard(w)
            lag_s = max(0.0, time.time() - change.occurred_at_ms / 1000) if result.verdict == "applied" else None
            self.metrics.schema_change(w, result.verdict, reason=result.reason, lag_s=lag_s)  # type: ignore[arg-type]
            await self._answer(change, result, vector, lag_s)
            if result.verdict == "refused":
                await self._dead_letter(item, result.reason or "refused", result.detail or "", change.change_id, w)
                log.warning("schema change %s refused for %s: %s", change.change_id, w, result.detail)
            self._settle(item)
            key = (w, change.kind, change.type_name)
            successors = self._pending.get(key, {}).pop(result.schema.version + 1, [])
            queue.extend((s, w) for s in successors)

    async def _vector(self, world: str) -> VersionVector:
        vector = self.vectors.get(world)
        if vector is None:
            vector = self.vectors[world] = VersionVector()
            for (kind, name), ts in (await asyncio.to_thread(self.store.contracts, world)).items():
                vector.set_data(f"{kind.value}:{name}", ts.version)
        return vector

    async def _intelligence(self, value: bytes | None) -> None:
        try:
            doc = orjson.loads(value or b"")
            world, version = doc["world_id"], int(doc["version"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("schema sync: ignoring an unreadable intelligence acknowledgement")
            return
        if not isinstance(world, str) or not await self._known_world(world):
            log.warning("schema sync: ignoring an intelligence acknowledgement for %r (no such world)", world)
            return
        vector = await self._vector(world)  # control and data from the branch at first sight
        vector.intelligence = max(vector.intelligence or 0, version)
        self.metrics.schema_versions(world, vector.versions())  # type: ignore[arg-type]

    def _record(self, result: SyncResult) -> None:
        self.results.append(result)
        del self.results[:-1000]

    async def _answer(
        self, change: SchemaChange, result: SyncResult, vector: VersionVector, lag_s: float | None
    ) -> None:
        if self._producer is None:
            return
        answer = StorageSchemaUpdated(
            change_id=change.change_id,
            world_id=change.world_id,
            kind=change.kind.value,
            type_name=change.type_name,
            requested_version=change.version,
            version=result.schema.version,
            world_version=vector.versions()["data"],
            status=result.verdict,
            commit=result.commit,
            reason=result.reason,
            detail=result.detail,
            handled_at_ms=int(time.time() * 1000),
            lag_ms=None if lag_s is None else int(lag_s * 1000),
        )
        await self._send_answer(answer)

    async def _send_answer(self, answer: StorageSchemaUpdated, key: bytes | None = None) -> None:
        if self._producer is None:
            return
        k = answer.key if answer.world_id and answer.kind and answer.type_name else key or answer.key
        await self._producer.send_and_wait(self.settings.schema_answer_topic, answer.encode(), key=k)

    async def _dead_letter(self, rec: Any, reason: str, detail: str, change_id: str | None, world: str | None) -> None:
        if self._producer is None:
            return
        dl = DeadLetter.of_record(rec, reason, detail, event_id=change_id, world_id=world)
        await self._producer.send_and_wait(self.settings.dlq_topic, dl.value, key=dl.key, headers=dl.headers())

    def summary(self) -> Mapping[str, Any]:
        return {
            "waiting": sum(len(h) for v in self._pending.values() for h in v.values()),
            "worlds": {w: v.versions() for w, v in self.vectors.items()},
        }


def attach(app: Any, settings: Settings, metrics: Metrics | None = None) -> SchemaSync:
    """Run schema sync inside a Faust worker: started after the app starts, stopped with it."""
    from mode import Service

    sync = SchemaSync(settings, metrics)

    class SchemaSyncService(Service):
        async def on_start(self) -> None:
            await sync.start()
            self.add_future(sync.run())

        async def on_stop(self) -> None:
            await sync.stop()

    app.add_dependency(SchemaSyncService())
    return sync


async def run_forever(settings: Settings | None = None) -> None:
    settings = settings or Settings.from_env()
    async with SchemaSync(settings) as sync:
        await sync.run()


def main() -> None:
    """``python -m agents.schema_sync``: schema sync alone, configured from ``CAUSEWAY_*``."""
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run_forever(settings))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
