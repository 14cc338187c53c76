"""Reconciliation: compare three counts per world and object type, and rebuild drifted projections.

Per world and object type, at one branch head ``H``:

* **control** — the control plane's count, the latest checkpoint on the count topic
  (``Settings.control_counts_topic``, contract in docs/schema.md);
* **projection** — live rows of ``entity_common`` (tombstones excluded);
* **log** — live objects derived from ``entity_events`` by replaying its *applied* events in
  commit order (:func:`derive`), i.e. what the projection must hold.

The event log is the truth the projection is rebuilt from; the control count is a cross-check (a
difference the log shares is missing input, which no rebuild can fix — it is reported as drift).
A type's drift is the largest of ``|control − projection|``, ``|control − log|`` and the number of
keys whose projection row differs from the log (missing, extra, other version or event). When it
exceeds ``Settings.reconcile_threshold``, the differing rows are rewritten from the log —
merge-on-read (new rows + one position-delete file) — and published as **one** Nessie commit
expecting ``H``; a concurrent worker commit makes it conflict, re-read and decide again. Reading
log and projection at the same head is what makes the comparison meaningful while events flow.
A second run right after finds nothing to repair and commits nothing.

Runs on ``Settings.reconcile_interval_s`` inside a worker (``attach``) and from the CLI
(``causeway reconcile``). Cost: one scan of the world's object events per run (the log is the
only complete source); see docs/schema.md for the bounds.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import In

from models.events import ChangeEvent, ChangeType, EntityKind, Invalid
from models.worlds import InvalidWorldId, WorldNaming, validate_world_id
from monitoring.metrics import Metrics, ReconcileOutcome
from sinks.committer import PROP_BATCH, PROP_WORLD, BatchCommitter, stage_replacement
from sinks.errors import CommitStateUnknown, NessieConflict
from sinks.rowdelta import read_state
from sinks.rows import projection_arrow
from sinks.tables import COMMON, EVENTS, contracts
from streams.settings import Settings
from worlds.manager import world_ids

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (object_type, object_pk)
PROP_RECONCILE = "causeway.reconcile.types"
#: What deciding needs of the log; the full events are read only for the keys a repair rewrites.
KEY_COLUMNS = ("event_id", "entity_type", "entity_pk", "change_type", "version", "committed_at")
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


# --- the count checkpoint contract ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControlCount:
    """One checkpoint: the control plane's live object count of a type in a world, as of a time."""

    world_id: str
    object_type: str
    count: int
    as_of_ms: int

    @property
    def key(self) -> bytes:
        return f"{self.world_id}::{self.object_type}".encode()

    def encode(self) -> bytes:
        return orjson.dumps(
            {"world_id": self.world_id, "object_type": self.object_type, "count": self.count, "as_of": self.as_of_ms}
        )


def decode_count(value: bytes | None) -> ControlCount | Invalid:
    """Decode a count checkpoint; never raises on bad input."""
    try:
        doc = orjson.loads(value or b"")
        world = validate_world_id(doc["world_id"])
        otype, count, as_of = doc["object_type"], doc["count"], doc.get("as_of", 0)
    except (orjson.JSONDecodeError, KeyError, TypeError, InvalidWorldId) as exc:
        return Invalid("bad-count", f"not a count checkpoint: {exc}")
    if not isinstance(otype, str) or not otype:
        return Invalid("bad-count", "'object_type' must be a non-empty string")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return Invalid("bad-count", "'count' must be an integer >= 0")
    if isinstance(as_of, bool) or not isinstance(as_of, int):
        return Invalid("bad-count", "'as_of' must be epoch milliseconds")
    return ControlCount(world, otype, count, as_of)


def latest_counts(checkpoints: Iterable[ControlCount]) -> dict[str, dict[str, int]]:
    """The newest checkpoint per (world, type) → ``{world: {type: count}}`` (later wins a tie)."""
    best: dict[tuple[str, str], ControlCount] = {}
    for c in checkpoints:
        k = (c.world_id, c.object_type)
        if k not in best or c.as_of_ms >= best[k].as_of_ms:
            best[k] = c
    out: dict[str, dict[str, int]] = {}
    for (world, otype), c in best.items():
        out.setdefault(world, {})[otype] = c.count
    return out


# --- pure comparison ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    """The identity of a projection row: which event wrote it."""

    version: int
    deleted: bool
    event_id: str


def derive(log_rows: Iterable[Mapping[str, Any]]) -> dict[Key, Mapping[str, Any]]:
    """The log row that must have written each key's projection row, from *applied* events in commit order.

    A DELETE leaves its row (a tombstone); a TRUNCATE drops every key of its type.
    """
    out: dict[Key, Mapping[str, Any]] = {}
    for r in log_rows:
        t = r["entity_type"]
        if r["change_type"] == ChangeType.TRUNCATE.value:
            for k in [k for k in out if k[0] == t]:
                del out[k]
            continue
        out[(t, r["entity_pk"])] = r
    return out


def expected(derived: Mapping[Key, Mapping[str, Any]]) -> dict[Key, Row]:
    return {
        k: Row(r["version"], r["change_type"] == ChangeType.DELETE.value, r["event_id"]) for k, r in derived.items()
    }


def differences(projection: Mapping[Key, Row], wanted: Mapping[Key, Row]) -> tuple[set[Key], set[Key]]:
    """Keys whose row must be (re)written from the log, and keys whose row must go."""
    write = {k for k, row in wanted.items() if projection.get(k) != row}
    remove = {k for k in projection if k not in wanted}
    return write, remove


def live_counts(rows: Mapping[Key, Row]) -> Counter[str]:
    return Counter(k[0] for k, r in rows.items() if not r.deleted)


@dataclass
class TypeReport:
    """One object type of one run."""

    object_type: str
    control: int | None
    projection: int
    log: int
    mismatched: int  # keys whose projection row differs from the log
    repaired: int = 0  # rows rewritten or removed

    @property
    def drift(self) -> int:
        diffs = [self.mismatched, abs(self.projection - self.log)]
        if self.control is not None:
            diffs += [abs(self.control - self.projection), abs(self.control - self.log)]
        return max(diffs)


@dataclass
class RunReport:
    """One world's run."""

    world_id: str
    outcome: ReconcileOutcome = "ok"
    types: dict[str, TypeReport] = field(default_factory=dict)
    commit: str | None = None
    head: str | None = None
    seconds: float = 0.0
    dry_run: bool = False
    error: str | None = None

    @property
    def drift(self) -> dict[str, int]:
        return {t: r.drift for t, r in self.types.items()}


def compare(
    projection: Mapping[Key, Row], wanted: Mapping[Key, Row], control: Mapping[str, int], threshold: int
) -> tuple[dict[str, TypeReport], set[Key], set[Key]]:
    """Per-type reports, and the keys to write / remove for the types whose drift passes ``threshold``."""
    write, remove = differences(projection, wanted)
    proj_live, log_live = live_counts(projection), live_counts(wanted)
    mismatched = Counter(k[0] for k in write | remove)
    types = sorted(set(proj_live) | set(log_live) | set(control) | set(mismatched))
    reports = {
        t: TypeReport(t, control.get(t), proj_live.get(t, 0), log_live.get(t, 0), mismatched.get(t, 0)) for t in types
    }
    over = {t for t, r in reports.items() if r.drift > threshold and r.mismatched}
    return reports, {k for k in write if k[0] in over}, {k for k in remove if k[0] in over}


# --- I/O ------------------------------------------------------------------------------------------


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


class Reconciler:
    """Runs reconciliation of worlds against their branches; blocking (pyiceberg), use a thread."""

    def __init__(
        self, settings: Settings, committer: BatchCommitter | None = None, metrics: Metrics | None = None
    ) -> None:
        self.settings = settings
        self.committer = committer or BatchCommitter(settings)
        self.metrics = metrics or Metrics()
        self.naming = WorldNaming(settings.prod_world, settings.main_branch)

    def worlds(self) -> list[str]:
        return world_ids(self.committer.client.list_references(), self.naming)

    def run_world(self, world: str, control: Mapping[str, int] | None = None, *, dry_run: bool = False) -> RunReport:
        """Reconcile one world; records metrics (unless ``dry_run``) and never raises."""
        started = time.monotonic()
        report = RunReport(world, dry_run=dry_run)
        try:
            report = self._run(world, dict(control or {}), dry_run)
        except Exception as exc:  # noqa: BLE001 - a failed run is recorded, not fatal
            log.exception("reconciliation of %s failed", world)
            report.outcome, report.error = "failed", f"{type(exc).__name__}: {exc}"
        report.seconds = time.monotonic() - started
        if not dry_run:
            repaired = sum(1 for r in report.types.values() if r.repaired)
            self.metrics.reconciled(
                world,
                report.outcome,
                duration_s=report.seconds,
                drift=report.drift,
                repairs=repaired,
            )
        return report

    def _run(self, world: str, control: dict[str, int], dry_run: bool) -> RunReport:
        branch = self.naming.branch(world)
        retries = self.settings.commit_retries
        run_id = f"reconcile:{uuid.uuid4().hex[:12]}"
        first_base: str | None = None
        unknown = False
        for attempt in range(1, retries + 2):
            if unknown and self.committer.find_batch_commit(branch, run_id, since=first_base):
                break  # landed: the next run confirms it is consistent
            cat = self.committer.catalog(branch)
            base = cat.begin()
            first_base = first_base or base
            try:
                return self._attempt(cat, world, base, control, dry_run, run_id)
            except NessieConflict:
                log.info("reconciliation of %s: conflict (attempt %d), re-reading", world, attempt)
            except CommitStateUnknown:
                unknown = True
            finally:
                cat.discard()
            time.sleep(self.committer.backoff(attempt))
        if unknown and self.committer.find_batch_commit(branch, run_id, since=first_base):
            return RunReport(world, "repaired", commit=self.committer.find_batch_commit(branch, run_id))
        raise NessieConflict(f"reconciliation of {world}: gave up after {retries + 1} attempts")

    def _attempt(
        self, cat: Any, world: str, base: str, control: dict[str, int], dry_run: bool, run_id: str
    ) -> RunReport:
        ns = self.settings.namespace
        report = RunReport(world, head=base, dry_run=dry_run)
        try:
            events = cat.load_table((ns, EVENTS.name))
        except NoSuchTableError:
            events = None
        log_rows: list[dict[str, Any]] = []
        if events is not None:
            scan = events.scan(
                row_filter=f"kind = '{EntityKind.OBJECT.value}' AND applied = true",
                selected_fields=KEY_COLUMNS + (("batch_seq",) if "batch_seq" in events.schema().column_names else ()),
            ).to_arrow()
            rows = scan.to_pylist()
            # Commit order: committed_at (taken per attempt, so a retried batch sorts after the commit
            # it lost to), then the batch's order: batch_seq, or read order for rows written without it.
            log_rows = [
                r
                for _, r in sorted(
                    enumerate(rows), key=lambda ir: (ir[1]["committed_at"], ir[1].get("batch_seq") or 0, ir[0])
                )
            ]
        derived = derive(log_rows)
        wanted = expected(derived)

        common = self.committer.load_or_create(cat, COMMON)
        state = read_state(common, ["object_type_id", "object_pk", "version", "deleted", "event_id"])
        projection: dict[Key, Row] = {}
        where: dict[Key, list[tuple[str, int]]] = {}
        if state.index is not None:
            cols = ("object_type_id", "object_pk", "version", "deleted", "event_id", "_file", "_pos")
            for t, pk, v, d, e, path, pos in zip(*(state.index.column(c).to_pylist() for c in cols), strict=True):
                where.setdefault((t, pk), []).append((path, pos))
                cur = projection.get((t, pk))
                if cur is None or v > cur.version:
                    projection[(t, pk)] = Row(v, d, e)
                if len(where[(t, pk)]) > 1:
                    projection[(t, pk)] = Row(-1, False, "")  # duplicate live rows: always rewrite
        reports, write, remove = compare(projection, wanted, control, self.settings.reconcile_threshold)
        report.types = reports
        if not (write or remove) or dry_run:
            if dry_run and (write or remove):
                for k in write | remove:
                    reports[k[0]].repaired += 1
            return report

        evs = self._events(events, world, [derived[k]["event_id"] for k in sorted(write)]) if write else []
        schema = common.schema().as_arrow()
        rows = projection_arrow(COMMON, evs, run_id, datetime.now(UTC), schema, contracts(common.metadata.properties))
        deletes: dict[str, list[int]] = {}
        for k in write | remove:
            for path, pos in where.get(k, ()):
                deletes.setdefault(path, []).append(pos)
        tx = common.transaction()
        stage_replacement(tx, common, rows, deletes, {PROP_BATCH: run_id})
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
    def _events(events: Any, world: str, event_ids: list[str]) -> list[ChangeEvent]:
        """The full log rows of ``event_ids`` as change events, in the given order."""
        found: dict[str, ChangeEvent] = {}
        for i in range(0, len(event_ids), 1000):
            chunk = event_ids[i : i + 1000]
            scan = events.scan(row_filter=In("event_id", chunk), selected_fields=EVENT_COLUMNS).to_arrow()
            for r in scan.to_pylist():
                found.setdefault(r["event_id"], _event(world, r))
        return [found[e] for e in event_ids]


async def read_control_counts(settings: Settings, timeout_s: float = 10.0) -> dict[str, dict[str, int]]:
    """The newest count checkpoint per (world, type), read from the start of the count topic to its end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = await consumer._client.fetch_all_metadata()  # noqa: SLF001 - no public per-topic lookup
        ids = parts.partitions_for_topic(settings.control_counts_topic) or set()
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


async def reconcile(
    settings: Settings,
    worlds: Iterable[str] | None = None,
    *,
    dry_run: bool = False,
    reconciler: Reconciler | None = None,
    metrics: Metrics | None = None,
) -> list[RunReport]:
    """One reconciliation pass over ``worlds`` (default: every world branch)."""
    rec = reconciler or Reconciler(settings, metrics=metrics)
    counts = await read_control_counts(settings)
    targets = list(worlds) if worlds is not None else await asyncio.to_thread(rec.worlds)
    reports = []
    for world in targets:
        reports.append(await asyncio.to_thread(rec.run_world, world, counts.get(world, {}), dry_run=dry_run))
    return reports


def attach(app: Any, settings: Settings, metrics: Metrics | None = None) -> Reconciler | None:
    """Run reconciliation every ``reconcile_interval_s`` inside a Faust worker (0 disables it)."""
    if settings.reconcile_interval_s <= 0:
        return None
    rec = Reconciler(settings, metrics=metrics)

    @app.task
    async def reconcile_loop() -> None:
        while not app.should_stop:
            await asyncio.sleep(settings.reconcile_interval_s)
            try:
                await reconcile(settings, reconciler=rec)
            except Exception:  # noqa: BLE001 - the next interval tries again
                log.exception("reconciliation pass failed")

    return rec
