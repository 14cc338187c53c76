"""Running the ApplyChanges saga against Kafka and the world's branch (the decisions are in ``api.saga``).

Where it sits: the asynchronous path (producers → change topics → worker) stays the only writer of
a branch. ApplyChanges publishes to the same topics and then *waits* until the worker has committed
every event, so the caller gets read-your-writes: the returned commit hash holds all its events.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaProducer

from api import world_manager_pb2 as pb
from api.saga import SagaOutcome, SagaRefused, compensations, validate_events
from models.events import ChangeEvent, EntityKind
from models.schema import TypeSchema
from sinks.readback import rows_matching
from sinks.tables import ENTITY_COMMON, ENTITY_EDGE, ENTITY_EVENTS, contracts
from streams.settings import Settings
from worlds.api import Worlds

log = logging.getLogger(__name__)


class ApplyChangesSaga:
    def __init__(self, settings: Settings, poll_s: float = 0.2) -> None:
        self.settings = settings
        self.poll_s = poll_s
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def _producer_ready(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self.settings.kafka_bootstrap, acks="all", enable_idempotence=True
                )
                await producer.start()
                self._producer = producer
            return self._producer

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    def topic(self, event: ChangeEvent) -> str:
        return self.settings.objects_topic if event.kind is EntityKind.OBJECT else self.settings.links_topic

    async def run(self, request: pb.ApplyChangesRequest) -> pb.ApplyChangesResponse:
        out = await self.execute(request.world_id, list(request.events_json), request.deadline_ms / 1000 or None)
        return pb.ApplyChangesResponse(
            status=out.status,
            commit_hash=out.commit_hash,
            failed_step=out.failed_step,
            message=out.message,
            compensated=out.compensated,
        )

    async def execute(self, world: str, raw: list[str], deadline_s: float | None = None) -> SagaOutcome:
        deadline_s = deadline_s or self.settings.api_apply_deadline_s
        with Worlds(self.settings) as w:
            try:
                schemas = await asyncio.to_thread(self._schemas, w, world)
                events = validate_events(world, raw, schemas, self.settings.max_event_bytes)
            except SagaRefused as exc:
                return SagaOutcome("failed", failed_step="validate", message=str(exc))
            published: list[ChangeEvent] = []
            try:
                producer = await self._producer_ready()
                for event in events:
                    await producer.send_and_wait(self.topic(event), event.encode(), key=event.key.encode())
                    published.append(event)
            except Exception as exc:  # noqa: BLE001 - the step failed; undo what went out
                return await self._compensate(published, "publish", f"publish failed after {len(published)}: {exc}")
            ids = [e.event_id for e in events]
            try:
                head, applied = await asyncio.wait_for(self._wait(w, world, ids), deadline_s)
            except TimeoutError:
                return await self._compensate(
                    published, "wait", f"not committed within {deadline_s:g}s (is a worker running for this world?)"
                )
            if len(applied) < len(ids):
                skipped = [i for i in ids if i not in applied]
                kept = [e for e in published if e.event_id in applied]
                return await self._compensate(
                    kept, "wait", f"{len(skipped)} event(s) were logged but not applied (stale version?): {skipped[:5]}"
                )
            return SagaOutcome("committed", commit_hash=head)

    def _schemas(self, w: Worlds, world: str) -> dict[tuple[EntityKind, str], TypeSchema]:
        head = w.head(world)  # NOT_FOUND for a world without a branch, before anything is published
        out: dict[tuple[EntityKind, str], TypeSchema] = {}
        for kind, table in ((EntityKind.OBJECT, ENTITY_COMMON), (EntityKind.LINK, ENTITY_EDGE)):
            t = w.table(head.pinned, table)
            if t is not None:
                out.update({(kind, name): ts for name, ts in contracts(t.metadata.properties).items()})
        return out

    async def _wait(self, w: Worlds, world: str, ids: list[str]) -> tuple[str, set[str]]:
        """Poll the branch head until every id is in its event log; (head hash, ids applied)."""
        while True:
            found = await asyncio.to_thread(self._logged, w, world, ids)
            if found is not None:
                return found
            await asyncio.sleep(self.poll_s)

    def _logged(self, w: Worlds, world: str, ids: list[str]) -> tuple[str, set[str]] | None:
        head = w.head(world)
        log_table = w.table(head.pinned, ENTITY_EVENTS)
        if log_table is None:
            return None
        seen = {r["event_id"]: r["applied"] for r in rows_matching(log_table, "event_id", ids, ("event_id", "applied"))}
        if not all(i in seen for i in ids):
            return None
        return head.hash, {i for i, a in seen.items() if a}

    async def _compensate(self, published: list[ChangeEvent], step: str, message: str) -> SagaOutcome:
        if not published:
            return SagaOutcome("failed", failed_step=step, message=message + "; nothing was published")
        undo = compensations(published, int(time.time() * 1000))
        sent = 0
        try:
            producer = await self._producer_ready()
            for event in undo:
                await producer.send_and_wait(self.topic(event), event.encode(), key=event.key.encode())
                sent += 1
        except Exception as exc:  # noqa: BLE001 - reported: the operator must finish the undo
            log.error("saga compensation failed after %d of %d events: %s", sent, len(undo), exc)
            return SagaOutcome(
                "failed",
                failed_step="compensate",
                message=f"{message}; compensation failed after {sent} of {len(undo)}: {exc}",
                compensated=sent,
            )
        return SagaOutcome("compensated", failed_step=step, message=message, compensated=sent)
