"""Reconciliation (I/O): read a world's branch at one head, compare, rebuild drifted rows; the timer; Redis.

The decisions are pure, in ``agents/reconcile_plan.py``. Per world and object type, at one branch
head ``H``:

* **control** — the control plane's count, the latest checkpoint on the count topic
  (``Settings.control_counts_topic``, contract in docs/schema.md);
* **projection** — live rows of ``entity_common`` (tombstones excluded);
* **log** — live objects derived from ``entity_events`` by replaying its *applied* events in
  commit order (:func:`derive`), i.e. what the projection must hold.

Both sides are kept per world between passes, in Arrow, by ``agents/reconcile_state.py``
(``Reconciler.checkpoints``): a pass reads and digests only the files the branch gained since the
last one, compares the whole world vectorized, and looks at the differing keys one by one (issue
13: a full replay cost ~50 CPU-seconds and 3.8 GB per pass at 670k objects). A new ``Reconciler``
(the CLI, a restarted worker's child) starts from nothing and reads everything once.

The event log is the truth the projection is rebuilt from; the control count is a cross-check (a
difference the log shares is missing input, which no rebuild can fix — it is reported as drift).
A type's drift is the largest of ``|control − projection|``, ``|control − log|`` and the number of
keys whose projection row differs from the log (missing, extra, other version or event, other
properties). When it exceeds ``Settings.reconcile_threshold``, the differing rows are rewritten
from the log — merge-on-read (new rows + one position-delete file) — and published as **one**
Nessie commit expecting ``H``; a concurrent worker commit makes it conflict, re-read and decide
again. A second run right after finds nothing to repair and commits nothing.

Where it runs: the worker's timer (``attach``: every ``Settings.reconcile_interval_s``, over the
worlds ``Settings.reconcile_worlds`` selects, each world in a child process so the worker's event
loop and web server keep answering) and the CLI (``causeway reconcile``). Every non-dry run is
recorded in Redis (``causeway:reconcile:<app_id>:last``); every worker exports those records as
``causeway_reconciliation_last_run_timestamp_seconds`` and ``…_drift``, so a run from the CLI is seen
by Prometheus too.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP

from agents.reconcile_plan import (
    ControlCount,
    Key,
    Row,
    RunReport,
    WorldScope,
    compare,
    contents_agree,
    decode_count,
    derive,
    expected,
    latest_counts,
)
from agents.reconcile_state import Checkpoint, FileInfo, live_counts, split_key
from models.errors import OperatorError
from models.events import ChangeEvent, ChangeType, EntityKind
from models.worlds import WorldNaming
from monitoring.metrics import Metrics, world_label
from sinks.catalog import NessieCatalog
from sinks.committer import PROP_BATCH, PROP_WORLD, BatchCommitter, stage_replacement
from sinks.errors import BranchMissing
from sinks.nessie import SyncNessieClient
from sinks.readback import deleted_positions, file_columns, live_files, open_table, rows_matching
from sinks.rows import projection_arrow
from sinks.tables import COMMON, EVENTS, contracts
from streams.kafka import topic_partitions
from streams.security import kafka_client_options
from streams.settings import Settings
from worlds.manager import world_ids

__all__ = [
    "ControlCount",
    "Reconciler",
    "ReconcileTimer",
    "Row",
    "RunReport",
    "attach",
    "compare",
    "decode_count",
    "derive",
    "expected",
    "latest_counts",
    "publish_runs",
    "reconcile",
]

log = logging.getLogger(__name__)

PROP_RECONCILE = "causeway.reconcile.types"
EVENT_COLUMNS = (
    "event_id",
    "entity_type",
    "entity_pk",
    "change_type",
    "version",
    "before_properties",
    "after_properties",
    "caused_by",
    "causal_order",
    "occurred_at",
    "schema_version",
    "source",
)


def _event(world: str, r: Mapping[str, Any]) -> ChangeEvent:
    occurred: datetime = r["occurred_at"]
    return ChangeEvent(
        event_id=r["event_id"],
        world_id=world,
        kind=EntityKind.OBJECT,
        entity_type=r["entity_type"],
        entity_pk=r["entity_pk"],
        change_type=ChangeType(r["change_type"]),
        version=r["version"],
        before=orjson.loads(r["before_properties"]) if r["before_properties"] else None,
        after=orjson.loads(r["after_properties"]) if r["after_properties"] else None,
        caused_by=r["caused_by"],
        causal_order=r["causal_order"],
        occurred_at_ms=int(occurred.timestamp() * 1000),
        schema_version=r["schema_version"],
        source=r["source"] or "",
    )


class UnknownWorld(OperatorError, LookupError):
    """The world has no branch."""


class Reconciler:
    """Runs reconciliation of worlds against their branches; blocking (pyiceberg), use a thread or a process."""

    def __init__(
        self, settings: Settings, committer: BatchCommitter | None = None, metrics: Metrics | None = None
    ) -> None:
        self.settings = settings
        self.committer = committer or BatchCommitter(settings)
        self.metrics = metrics or Metrics()
        self.naming = WorldNaming(settings.prod_world, settings.main_branch)
        #: Per world, what the last pass read (agents/reconcile_state.py): the next pass reads what changed.
        self.checkpoints: dict[str, Checkpoint] = {}

    def worlds(self) -> list[str]:
        return world_ids(self.committer.occ.client.list_references(), self.naming)

    def retain(self, worlds: Iterable[str]) -> list[str]:
        """Keep the checkpoints of ``worlds`` only; returns the worlds whose checkpoints are held.

        A checkpoint is ~200 bytes per key: one of a world that left the scope (its branch deleted,
        the scope narrowed, a worker no longer serving it) would be held for the child's life.
        """
        keep = set(worlds)
        for world in [w for w in self.checkpoints if w not in keep]:
            del self.checkpoints[world]
        return sorted(self.checkpoints)

    def run_world(self, world: str, control: Mapping[str, int] | None = None, *, dry_run: bool = False) -> RunReport:
        """Reconcile one world and record its metrics (unless ``dry_run``); never raises."""
        report = self.check(world, control, dry_run=dry_run)
        if not dry_run:
            record(self.metrics, report)
        return report

    def check(self, world: str, control: Mapping[str, int] | None = None, *, dry_run: bool = False) -> RunReport:
        """Reconcile one world (repairing unless ``dry_run``); records nothing and never raises."""
        started = time.monotonic()
        report = RunReport(world, dry_run=dry_run)
        try:
            report = self._run(world, dict(control or {}), dry_run)
        except UnknownWorld as exc:
            self.checkpoints.pop(world, None)
            report.outcome, report.error = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed run is reported, not fatal
            self.checkpoints.pop(world, None)  # it may hold half a pass: the next one reads everything
            log.warning("reconciliation of %s failed: %s: %s", world, type(exc).__name__, exc)
            log.debug("reconciliation of %s failed", world, exc_info=True)
            report.outcome, report.error = "failed", f"{type(exc).__name__}: {exc}"
        report.seconds = time.monotonic() - started
        report.finished_at = time.time()
        return report

    def _run(self, world: str, control: dict[str, int], dry_run: bool) -> RunReport:
        branch = self.naming.branch(world)
        run_id = f"reconcile:{uuid.uuid4().hex[:12]}"

        def attempt(cat: NessieCatalog, base: str, n: int) -> RunReport:
            return self._attempt(cat, world, base, control, dry_run, run_id)

        try:
            return self.committer.occ.run(
                branch,
                attempt,
                what=f"reconciliation of {world}",
                commit_id=run_id,
                # landed: the next run confirms it is consistent
                landed=lambda found, attempts: RunReport(world, "repaired", commit=found),
            )
        except BranchMissing:
            raise UnknownWorld(f"world {world} has no branch ({branch})") from None

    def _attempt(
        self, cat: Any, world: str, base: str, control: dict[str, int], dry_run: bool, run_id: str
    ) -> RunReport:
        ns = self.settings.namespace
        report = RunReport(world, head=base, dry_run=dry_run)
        events = open_table(cat, ns, EVENTS.name)
        common = self.committer.load_or_create(cat, COMMON)
        ids = (_table_id(events), _table_id(common))
        point = self.checkpoints.get(world)
        if point is None or point.table_ids != ids:
            point = self.checkpoints[world] = Checkpoint(ids)
        point.read_rows = point.digested = 0
        if events is not None:
            point.advance_log(_infos(events), lambda path, cols: file_columns(events, path, cols))
        point.advance_projection(
            _infos(common),
            lambda path, cols: file_columns(common, path, cols),
            lambda path: deleted_positions(common, path),
        )
        live, paths = point.projection()
        odd = point.differing(live)
        log.info(
            "reconciliation of %s: read %d row(s), digested %d, %d key(s) differ; checkpoint %d MiB",
            world, point.read_rows, point.digested, len(odd), point.nbytes() >> 20,
        )  # fmt: skip
        odd_keys = pa.array(sorted(odd), pa.string())
        projection: dict[Key, Row] = {}
        where: dict[Key, list[tuple[str, int]]] = {}
        for r in live.filter(pc.is_in(live.column("key"), value_set=odd_keys)).to_pylist():
            k = split_key(r["key"])
            where.setdefault(k, []).append((paths[r["_fid"]], r["_pos"]))
            cur = projection.get(k)
            if cur is None or r["version"] > cur.version:
                projection[k] = Row(r["version"], r["deleted"], r["event_id"], r["digest"])
            if len(where[k]) > 1:
                projection[k] = Row(-1, False, "")  # duplicate live rows: always rewrite
        wanted: dict[Key, Row] = {}
        for r in point.wanted.filter(pc.is_in(point.wanted.column("key"), value_set=odd_keys)).to_pylist():
            wanted[split_key(r["key"])] = Row(r["version"], r["deleted"], r["event_id"], r["digest"])
        # Right writer, other digest: compare the contents (carried-over properties are not drift).
        suspects = [k for k, want in wanted.items() if (have := projection.get(k)) and have.same_writer(want)]
        texts = self._texts(common, {k: where[k][0] for k in suspects}) if suspects else {}
        logged = self._logged(events, [wanted[k].event_id for k in suspects]) if suspects else {}
        contents_differ: set[Key] = set()  # right writer, wrong properties
        for k in suspects:
            if contents_agree(texts.get(k), logged.get(wanted[k].event_id)):
                projection[k] = wanted[k]
            else:
                contents_differ.add(k)
        counts = (live_counts(live), live_counts(point.wanted))
        reports, write, remove = compare(projection, wanted, control, self.settings.reconcile_threshold, counts)
        report.types = reports
        if not (write or remove) or dry_run:
            if dry_run and (write or remove):
                for k in write | remove:
                    reports[k[0]].repaired += 1
            return report

        evs = self._events(events, world, [wanted[k].event_id for k in sorted(write)]) if write else []
        evs = [
            _carry(ev, texts.get((ev.entity_type, ev.entity_pk)))
            if (ev.entity_type, ev.entity_pk) in contents_differ
            else ev
            for ev in evs
        ]
        schema = common.schema().as_arrow()
        rows_out = projection_arrow(
            COMMON, evs, run_id, datetime.now(UTC), schema, contracts(common.metadata.properties)
        )
        deletes: dict[str, list[int]] = {}
        for k in write | remove:
            for path, pos in where.get(k, ()):
                deletes.setdefault(path, []).append(pos)
        tx = common.transaction()
        stage_replacement(tx, common, rows_out, deletes, {PROP_BATCH: run_id})
        tx.commit_transaction()
        fixed = Counter(k[0] for k in write | remove)
        published = cat.publish(
            f"causeway: reconcile world {world}: rebuilt {sum(fixed.values())} row(s) from the event log",
            {PROP_WORLD: world, PROP_BATCH: run_id, PROP_RECONCILE: ",".join(sorted(fixed))},
        )
        for t, n in fixed.items():
            reports[t].repaired = n
        report.outcome, report.commit = "repaired", published.hash
        log.warning("reconciliation of %s repaired %s in %s", world, dict(fixed), published.hash[:12])
        return report

    @staticmethod
    def _texts(common: Any, at: Mapping[Key, tuple[str, int]]) -> dict[Key, str | None]:
        """The properties text of one live row per key, read from its file."""
        out: dict[Key, str | None] = {}
        for path in {p for p, _ in at.values()}:
            props = file_columns(common, path, ("properties",)).column("properties")
            for k, (p, pos) in at.items():
                if p == path:
                    out[k] = props[pos].as_py()
        return out

    @staticmethod
    def _logged(events: Any, event_ids: list[str]) -> dict[str, str | None]:
        """The log's ``after_properties`` of ``event_ids``."""
        rows = rows_matching(events, "event_id", event_ids, ("event_id", "after_properties"), chunk=1000)
        return {r["event_id"]: r["after_properties"] for r in rows}

    @staticmethod
    def _events(events: Any, world: str, event_ids: list[str]) -> list[ChangeEvent]:
        """The full log rows of ``event_ids`` as change events, in the given order."""
        found: dict[str, ChangeEvent] = {}
        for r in rows_matching(events, "event_id", event_ids, EVENT_COLUMNS, chunk=1000):
            found.setdefault(r["event_id"], _event(world, r))
        return [found[e] for e in event_ids]


def _table_id(table: Any) -> str:
    return "" if table is None else str(table.metadata.table_uuid)


def _infos(table: Any) -> list[FileInfo]:
    return [FileInfo(f.path, f.rows, f.deletes) for f in live_files(table)]


def _carry(ev: ChangeEvent, current: str | None) -> ChangeEvent:
    """A row rebuilt for its contents keeps the properties it has beyond its event's.

    The committer carries properties an event names as unchanged over from the previous row, and
    the log does not record which those were; the event's own properties take the log's values.
    """
    if not current or ev.change_type is ChangeType.DELETE:
        return ev
    old = orjson.loads(current)
    if not isinstance(old, dict):
        return ev
    extra = {k: v for k, v in old.items() if k not in (ev.after or {})}
    return replace(ev, after={**extra, **(ev.after or {})}) if extra else ev


def record(metrics: Metrics, report: RunReport) -> None:
    """Export one run (the coordinator records once, from the report)."""
    metrics.reconciled(
        report.world_id,
        report.outcome,
        duration_s=report.seconds,
        drift=report.drift,
        repairs=sum(1 for r in report.types.values() if r.repaired),
        at=report.finished_at or None,
    )


async def read_control_counts(settings: Settings, timeout_s: float = 10.0) -> dict[str, dict[str, int]]:
    """The newest count checkpoint per (world, type), read from the start of the count topic to its end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, **kafka_client_options(settings)
    )
    await consumer.start()
    try:
        ids = await topic_partitions(consumer, settings.control_counts_topic)
        tps = [KafkaTP(settings.control_counts_topic, p) for p in sorted(ids)]
        if not tps:
            return {}
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        checkpoints: list[ControlCount] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            behind = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
            if not behind:
                break
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for rec in records:
                    c = decode_count(rec.value)
                    if isinstance(c, ControlCount):
                        checkpoints.append(c)
                    else:
                        log.warning("count checkpoint %s@%d ignored: %s", rec.topic, rec.offset, c.detail)
        return latest_counts(checkpoints)
    finally:
        await consumer.stop()


# --- runs recorded in Redis, exported by every worker ----------------------------------------------


def runs_key(settings: Settings) -> str:
    """The Redis hash of a deployment's last run per world (``app_id`` keeps deployments apart)."""
    return f"causeway:reconcile:{settings.app_id}:last"


async def publish_runs(settings: Settings, reports: Iterable[RunReport], existing: Iterable[str] | None = None) -> None:
    """Record non-dry runs in Redis (world → {at, outcome, drift}); drop worlds that no longer exist.

    Raises redis errors: the caller decides whether a missing record is worth more than a warning.
    """
    import redis.asyncio as aioredis

    entries = {
        r.world_id: orjson.dumps({"at": r.finished_at or time.time(), "outcome": r.outcome, "drift": r.drift})
        for r in reports
        if not r.dry_run
    }
    client = aioredis.from_url(settings.redis_url)
    try:
        key = runs_key(settings)
        if entries:
            await client.hset(key, mapping=entries)  # type: ignore[arg-type]
        if existing is not None:
            gone = {_text(k) for k in await client.hkeys(key)} - set(existing)
            if gone:
                await client.hdel(key, *gone)
    finally:
        await client.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def read_runs(settings: Settings) -> dict[str, dict[str, Any]]:
    import redis.asyncio as aioredis

    client = aioredis.from_url(settings.redis_url)
    try:
        raw = await client.hgetall(runs_key(settings))
    finally:
        await client.aclose()
    out = {}
    for world, value in raw.items():
        try:
            out[_text(world)] = orjson.loads(value)
        except orjson.JSONDecodeError:
            log.warning("reconciliation record of %r in Redis is unreadable; ignored", world)
    return out


def export_runs(metrics: Metrics, runs: Mapping[str, Mapping[str, Any]], exported: dict[str, float]) -> None:
    """Set the staleness and drift gauges from recorded runs newer than what ``exported`` holds.

    Label values go straight through ``world_label``: a world another process reconciled gets these
    two series only, not the per-world event and commit series of a world this worker serves.
    """
    for world, run in runs.items():
        at = run.get("at")
        if not isinstance(at, int | float) or at <= exported.get(world, 0):
            continue
        w = world_label(world)
        metrics.reconcile_last_run.labels(w).set(at)
        for object_type, d in (run.get("drift") or {}).items():
            if isinstance(d, int):
                metrics.reconcile_drift.labels(w, object_type).set(abs(d))
        exported[world] = at


# --- running passes ---------------------------------------------------------------------------------


async def reconcile(
    settings: Settings,
    worlds: Iterable[str] | None = None,
    *,
    dry_run: bool = False,
    reconciler: Reconciler | None = None,
    metrics: Metrics | None = None,
) -> list[RunReport]:
    """One reconciliation pass over ``worlds`` (default: every world branch), in this process.

    Metrics are recorded (unless ``dry_run``); Redis recording is the caller's (``publish_runs``).
    """
    rec = reconciler or Reconciler(settings, metrics=metrics)
    counts = await read_control_counts(settings)
    targets = list(worlds) if worlds is not None else await asyncio.to_thread(rec.worlds)
    reports = []
    for world in targets:
        reports.append(await asyncio.to_thread(rec.run_world, world, counts.get(world, {}), dry_run=dry_run))
    return reports


_child: Reconciler | None = None


def _check_in_child(
    settings: Settings, world: str, control: Mapping[str, int], before: Callable[[str], None] | None
) -> RunReport:
    """Runs in the timer's child process: one Reconciler (and its file cache) per child."""
    global _child
    if _child is None or _child.settings != settings:
        _child = Reconciler(settings)
    if before is not None:
        before(world)
    return _child.check(world, control)


def _retain_in_child(worlds: frozenset[str] | None) -> list[str]:
    """Runs in the timer's child: drop the checkpoints of worlds out of this pass's scope (None:
    drop nothing); returns the worlds whose checkpoints it holds."""
    if _child is None:
        return []
    return _child.retain(worlds) if worlds is not None else sorted(_child.checkpoints)


class ReconcileTimer:
    """The worker's reconciliation: a pass every ``reconcile_interval_s`` and the Redis read-back.

    A pass covers the worlds ``Settings.reconcile_worlds`` selects; each world runs in a child
    process (one at a time), because reading a world's log holds the GIL for long stretches (Arrow
    → Python conversions) and would starve the worker's event loop, its web server included.
    ``before_world`` runs in the child before each world (tests use it to simulate a slow world).
    """

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        served: Callable[[], Iterable[str]] = lambda: (),
        *,
        before_world: Callable[[str], None] | None = None,
        readback_interval_s: float = 15.0,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.served = served
        self.scope = WorldScope.parse(settings.reconcile_worlds)
        self.before_world = before_world
        self.readback_interval_s = readback_interval_s
        self.naming = WorldNaming(settings.prod_world, settings.main_branch)
        self._pool: ProcessPoolExecutor | None = None
        self._client: SyncNessieClient | None = None
        self._exported: dict[str, float] = {}
        self._stopping = asyncio.Event()

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: a fork of a process running an event loop and threads is not safe.
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    async def targets(self) -> list[str]:
        if self._client is None:
            self._client = SyncNessieClient.from_settings(self.settings)
        refs = await asyncio.to_thread(self._client.list_references)
        return self.scope.select(world_ids(refs, self.naming), self.served())

    async def run_pass(self) -> list[RunReport]:
        """Reconcile every world in scope (each in the child process); record and publish the results."""
        targets = await self.targets()
        counts = await read_control_counts(self.settings) if targets else {}
        loop = asyncio.get_running_loop()
        if self._pool is not None:  # no child yet: it holds nothing
            await loop.run_in_executor(self._pool, _retain_in_child, frozenset(targets))
        reports = []
        for world in targets:
            if self._stopping.is_set():
                break
            report = await loop.run_in_executor(
                self._executor(), _check_in_child, self.settings, world, counts.get(world, {}), self.before_world
            )
            record(self.metrics, report)
            self._exported[world] = max(self._exported.get(world, 0), report.finished_at)
            reports.append(report)
        try:
            await publish_runs(self.settings, reports)
        except Exception as exc:  # noqa: BLE001 - the local metrics still hold the run
            log.warning("reconciliation: could not record the pass in Redis: %s: %s", type(exc).__name__, exc)
        return reports

    async def held_checkpoints(self) -> list[str]:
        """The worlds whose checkpoints the child holds (empty before the first pass)."""
        if self._pool is None:
            return []
        return await asyncio.get_running_loop().run_in_executor(self._pool, _retain_in_child, None)

    async def readback(self) -> None:
        """Export runs recorded in Redis (the CLI's, other workers') once."""
        try:
            export_runs(self.metrics, await read_runs(self.settings), self._exported)
        except Exception as exc:  # noqa: BLE001 - metrics must never stop the worker
            log.warning("reconciliation read-back failed: %s: %s", type(exc).__name__, exc)

    async def run(self) -> None:
        """Read back every ``readback_interval_s``; run a pass every ``reconcile_interval_s`` (if > 0)."""
        interval = self.settings.reconcile_interval_s
        next_pass = time.monotonic() + interval if interval > 0 else None
        while not self._stopping.is_set():
            await self.readback()
            if next_pass is not None and time.monotonic() >= next_pass:
                try:
                    await self.run_pass()
                except Exception as exc:  # noqa: BLE001 - the next interval tries again
                    log.warning("reconciliation pass failed: %s: %s", type(exc).__name__, exc)
                next_pass = time.monotonic() + interval
            wait = (
                self.readback_interval_s
                if next_pass is None
                else min(self.readback_interval_s, max(0.0, next_pass - time.monotonic()))
            )
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=wait)
            except TimeoutError:
                pass

    async def stop(self) -> None:
        """Stop at once: a world being reconciled in the child is abandoned (its commit is atomic)."""
        self._stopping.set()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            children = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for child in children:
                if child.is_alive():
                    child.terminate()
            for child in children:
                await asyncio.to_thread(child.join, 10)
        if self._client is not None:
            self._client.close()
            self._client = None


def attach(
    app: Any, settings: Settings, metrics: Metrics | None = None, served: Callable[[], Iterable[str]] | None = None
) -> ReconcileTimer:
    """Run the reconciliation timer and the Redis read-back inside a Faust worker (started and stopped with it).

    ``served`` returns the worlds the worker applied events for (the ``served`` scope term).
    """
    from mode import Service

    timer = ReconcileTimer(settings, metrics or Metrics(), served or (lambda: ()))

    class ReconcileService(Service):
        async def on_start(self) -> None:
            self.add_future(timer.run())

        async def on_stop(self) -> None:
            await timer.stop()

    app.add_dependency(ReconcileService())
    return timer
