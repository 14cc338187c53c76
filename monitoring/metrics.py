"""Every causeway metric, defined once, with typed helpers that hide the label plumbing.

One ``Metrics`` object owns a dedicated ``CollectorRegistry`` (never the process-global one, so tests
build as many as they like). The worker serves that registry, and nothing else, on ``/metrics``
(``add_metrics_page``).

Label values come only from small, bounded sets: world ids (validated, else ``invalid``), topics,
partitions, stable reason codes (sanitised, else ``other``) and the outcome enums below. Event ids,
keys and free text never become label values.

Times are exported as Unix timestamps where an *age* is wanted (last commit, last reconciliation,
oldest in-flight event): PromQL computes ``time() - ts`` at query time, so the age keeps growing while
a worker is alive but stuck. A worker-computed age gauge would freeze at its last value instead.
See docs/metrics.md for every metric and the panels and alerts that read it.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.metrics import MetricWrapperBase

from models.worlds import InvalidWorldId, validate_world_id

EventOutcome = Literal["applied", "duplicate", "parked", "released", "dead_lettered", "dead_letter_replay"]
CommitOutcome = Literal["committed", "already_committed", "retries_exhausted", "failed"]
RetryReason = Literal["conflict", "unknown_state", "transient"]
SchemaOutcome = Literal["applied", "duplicate", "waiting", "refused"]
ReconcileOutcome = Literal["ok", "repaired", "failed"]
MergeOutcome = Literal["merged", "conflict", "failed"]
Dependency = Literal["redis", "nessie", "kafka"]
Layer = Literal["control", "data", "intelligence"]

EVENT_OUTCOMES: tuple[EventOutcome, ...] = (
    "applied",
    "duplicate",
    "parked",
    "released",
    "dead_lettered",
    "dead_letter_replay",
)
COMMIT_OUTCOMES: tuple[CommitOutcome, ...] = ("committed", "already_committed", "retries_exhausted", "failed")
RETRY_REASONS: tuple[RetryReason, ...] = ("conflict", "unknown_state", "transient")
SCHEMA_OUTCOMES: tuple[SchemaOutcome, ...] = ("applied", "duplicate", "waiting", "refused")
RECONCILE_OUTCOMES: tuple[ReconcileOutcome, ...] = ("ok", "repaired", "failed")
MERGE_OUTCOMES: tuple[MergeOutcome, ...] = ("merged", "conflict", "failed")
DEPENDENCIES: tuple[Dependency, ...] = ("redis", "nessie", "kafka")
LAYERS: tuple[Layer, ...] = ("control", "data", "intelligence")

UNKNOWN_WORLD = "unknown"  # the event carried no readable world id
INVALID_WORLD = "invalid"  # it carried one that may not become a label (or a branch)
ALL_WORLDS = "all"  # in-flight counts of a whole worker process (Metrics.inflight)
OTHER_REASON = "other"
# Every reason code a change-topic record can be dead-lettered with (models.events, agents.causal,
# agents.dedupe, agents.applier; a unit test keeps this list complete). Their dead-letter series start
# at 0 for each consumed topic, so the first record of a reason is an increase() the alert sees.
DEAD_LETTER_REASONS = (
    "bad-characters", "bad-timestamp", "bad-world-id", "empty-field", "field-too-long", "malformed-json",
    "missing-after", "missing-field", "negative-number", "not-an-object", "number-too-large", "oversized",
    "self-caused", "tombstone", "wrong-topic", "wrong-type", "cause-missing", "causal-cycle",
    "stale-version", "unknown-world", "commit-failed", "world-unreadable",
)  # fmt: skip
_REASON = re.compile(r"[a-z0-9][a-z0-9_.-]{0,47}")

# Buckets, in the metric's base unit.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
# One series, so bounds close enough (at most 1.5x apart from 1 s to 30 s) that a quantile read from
# them is the wait's, not the bucket's: with many worlds the wait is a round of commits, 3-20 s, and
# LATENCY_BUCKETS' 5-10-30 s steps read a 5.4 s round as a 9.9 s p99 (docs/benchmarks.md, 2026-12-02
# afternoon, "the flush order at 100 worlds").
FLUSH_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 4, 5, 6, 7.5, 10, 12.5, 15, 20, 25, 30, 60, 120, 300, 900)
CAUSAL_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300)
COMMIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ROWS_BUCKETS = (1, 10, 100, 500, 1_000, 5_000, 10_000, 50_000, 100_000)
BYTES_BUCKETS = tuple(1024 * 4**k for k in range(10))  # 1 KiB … 256 MiB
SCHEMA_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
RECONCILE_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900)


@dataclass(frozen=True)
class MetricInfo:
    """What docs and tests need to know about one metric, as exposed (counters with ``_total``)."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


def observe_many(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(v)`` for each value, in one update per bucket: the same series, the same
    counts and sum (``tests/unit/test_monitoring_metrics.py``), without a locked update per value (a flush
    observes one latency per event: ~1.5 µs each).

    prometheus_client has no bulk observe; this reads the child's bucket bounds and counters
    (``_upper_bounds``, ``_buckets``, ``_sum``) and falls back to ``observe`` if they are not there.
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if not values:
        return
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets) or bounds[-1] != float("inf"):
        for v in values:
            histogram.observe(v)
        return
    histogram._raise_if_not_observable()
    counts = [0] * len(bounds)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1  # the first bound >= v, as observe picks it
    total.inc(sum(values))
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)


def world_label(world: str | None) -> str:
    """A world id safe to use as a label value: the id if valid, else ``unknown`` / ``invalid``."""
    if world is None or world == "":
        return UNKNOWN_WORLD
    try:
        return validate_world_id(world)
    except InvalidWorldId:
        return INVALID_WORLD


def reason_label(reason: str | None) -> str:
    """A stable reason code (``malformed-json``) as a label; anything else collapses to ``other``."""
    if reason and _REASON.fullmatch(reason):
        return reason
    return OTHER_REASON


def _check(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")
    return value


class Metrics:
    """All causeway metrics in one registry, plus helpers named for what happened."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.catalog: list[MetricInfo] = []
        self._worlds: set[str] = set()
        # Children of the hot path's series (per poll, flush and tick): ``labels()`` converts,
        # checks and locks on every call (a third to a half of each helper's CPU), and a 100-world
        # worker calls it a few thousand times a second. Label values are bounded (module doc).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # Worlds whose oldest-in-flight series exists (``inflight`` removes it when they have none).
        self._oldest_shown: set[str] = set()
        c, g, h = self._counter, self._gauge, self._histogram

        # --- lag and latency ----------------------------------------------------------------------
        self.events_consumed = c(
            "causeway_events_consumed_total", "Records read from Kafka, before decoding.", ("topic",)
        )
        self.inflight_events = g(
            "causeway_inflight_events",
            "Events consumed but not yet committed (buffered, parked or committing), per world or 'all' per worker.",
            ("world",),
        )
        self.inflight_oldest = g(
            "causeway_inflight_oldest_timestamp_seconds",
            "When the oldest in-flight event of a world (or 'all') was consumed (Unix time); absent when none is.",
            ("world",),
        )
        self.e2e_latency = h(
            "causeway_e2e_latency_seconds",
            "Event occurred_at to the Nessie commit that applied it (producer clock; negative clamped to 0).",
            ("world",),
            LATENCY_BUCKETS,
        )
        self.last_commit = g(
            "causeway_world_last_commit_timestamp_seconds",
            "Unix time of the last commit to a world's branch; freshness is time() minus this.",
            ("world",),
        )

        # --- event outcomes ----------------------------------------------------------------------
        self.events = c(
            "causeway_events_total",
            "Change events by outcome: applied, duplicate, parked, released, dead_lettered (with reason), "
            "dead_letter_replay (redelivered after its dead letter, settled without a second one).",
            ("world", "outcome", "reason"),
        )
        self.dead_letters = c(
            "causeway_dead_letters_total",
            "Records published to the dead-letter topic, by the topic they came from and reason code.",
            ("topic", "reason"),
        )
        self.parked = g(
            "causeway_parked_events",
            "Events waiting in the causal gate for their cause, per world.",
            ("world",),
        )
        self.causal_wait = h(
            "causeway_causal_wait_seconds",
            "Time an event waited in the causal gate before it was released.",
            (),
            CAUSAL_WAIT_BUCKETS,
        )

        # --- Nessie commits ----------------------------------------------------------------------
        self.commits = c(
            "causeway_commits_total",
            "World flushes by final outcome: committed, already_committed (unknown outcome checked), "
            "retries_exhausted, failed.",
            ("world", "outcome"),
        )
        self.occ_conflicts = c(
            "causeway_occ_conflicts_total",
            "Nessie commit attempts refused with 409 (expected-hash conflict).",
            ("world",),
        )
        self.commit_retries = c(
            "causeway_commit_retries_total",
            "Commit attempts retried, by reason: conflict, unknown_state, transient.",
            ("world", "reason"),
        )
        self.commit_retries_exhausted = c(
            "causeway_commit_retries_exhausted_total",
            "Flushes that gave up after the configured retries; their events are not acked and come back.",
            ("world",),
        )
        self.commit_duration = h(
            "causeway_commit_duration_seconds",
            "One world flush, from first attempt to final outcome (with retries).",
            ("world",),
            COMMIT_BUCKETS,
        )
        self.flush_wait = h(
            "causeway_flush_wait_seconds",
            "Age of a world batch's oldest event when that world's flush starts: batching, the commit "
            "budget and the world's previous flush in flight (the rest of the latency is the commit).",
            (),
            FLUSH_WAIT_BUCKETS,  # with many worlds the wait is the latency: tens of seconds
        )
        self.batch_rows = h("causeway_batch_rows", "Events in one committed world flush.", (), ROWS_BUCKETS)
        self.batch_bytes = h(
            "causeway_batch_bytes", "Data-file bytes written by one committed world flush.", (), BYTES_BUCKETS
        )
        self.values_unconverted = c(
            "causeway_typed_values_unconverted_total",
            "Property values that do not convert to their typed column: left null there, kept in the JSON.",
            ("world",),
        )

        # --- consistency -------------------------------------------------------------------------
        self.schema_version = g(
            "causeway_schema_version",
            "Schema version per layer (control, data, intelligence) and world.",
            ("world", "layer"),
        )
        self.version_difference = g(
            "causeway_version_vector_difference",
            "Largest minus smallest layer version in a world's version vector.",
            ("world",),
        )
        self.schema_changes = c(
            "causeway_schema_changes_total",
            "Schema changes handled by schema sync: applied, duplicate, waiting, refused (with reason).",
            ("world", "outcome", "reason"),
        )
        self.schema_sync_lag = h(
            "causeway_schema_sync_lag_seconds",
            "Control-plane schema.updated to the change committed on the world branch.",
            ("world",),
            SCHEMA_LAG_BUCKETS,
        )
        self.reconcile_runs = c(
            "causeway_reconciliation_runs_total",
            "Reconciliation runs by outcome: ok, repaired, failed.",
            ("world", "outcome"),
        )
        self.reconcile_drift = g(
            "causeway_reconciliation_drift",
            "Largest count difference (control, projection, event log) in the last run, per object type.",
            ("world", "object_type"),
        )
        self.reconcile_repairs = c(
            "causeway_reconciliation_repairs_total",
            "Projections rebuilt from the event log by reconciliation.",
            ("world",),
        )
        self.reconcile_duration = h(
            "causeway_reconciliation_duration_seconds",
            "One reconciliation run of one world.",
            (),
            RECONCILE_BUCKETS,
        )
        self.reconcile_last_run = g(
            "causeway_reconciliation_last_run_timestamp_seconds",
            "Unix time the last reconciliation run of a world finished.",
            ("world",),
        )
        self.idempotency_lookups = c(
            "causeway_idempotency_lookups_total",
            "Event ids checked against the Redis dedupe store.",
            ("world",),
        )
        self.idempotency_duplicates = c(
            "causeway_idempotency_duplicates_total",
            "Event ids the Redis dedupe store already knew (idempotency hits).",
            ("world",),
        )
        self.merges = c(
            "causeway_merges_total",
            "World merges by outcome: merged, conflict, failed.",
            ("world", "outcome"),
        )
        self.merge_conflicts = c(
            "causeway_merge_conflicts_total", "Conflicting keys reported by world merges.", ("world",)
        )

        # --- CDC ingest (agents/cdc.py) ----------------------------------------------------------
        self.cdc_skipped = c(
            "causeway_cdc_records_skipped_total",
            "Raw CDC records skipped with their offset committed, by kind: tombstone, heartbeat, "
            "schema-change, transaction, message, unmapped.",
            ("reason",),
        )
        self.cdc_events = c("causeway_cdc_events_produced_total", "Change events the CDC ingest produced.", ())
        self.cdc_failures = c(
            "causeway_cdc_failures_total",
            "CDC ingest failures by kind: produce (batch re-read), event-too-large (record dead-lettered), "
            "broker-refused (batch produced again one by one), commit (offset commit lost to a rebalance).",
            ("reason",),
        )
        self.cdc_last_commit = g(
            "causeway_cdc_last_commit_timestamp_seconds", "Unix time of the CDC ingest's last offset commit.", ()
        )
        self.cdc_waiting = g(
            "causeway_cdc_waiting_messages",
            "Raw CDC records on the ingest's partitions not yet committed (high watermark minus committed offset).",
            (),
        )

        # --- dependencies ------------------------------------------------------------------------
        self.dependency_up = g(
            "causeway_dependency_up",
            "1 if the worker's last health probe of a dependency succeeded, else 0.",
            ("dependency",),
        )

    # --- definitions --------------------------------------------------------------------------------
    def _add(self, cls: type[MetricWrapperBase], name: str, doc: str, labels: tuple[str, ...], **kw: Any) -> Any:
        metric = cls(name, doc, labels, registry=self.registry, **kw)
        kind = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}[cls]
        self.catalog.append(MetricInfo(name, kind, labels, doc))
        return metric

    def _counter(self, name: str, doc: str, labels: tuple[str, ...]) -> Counter:
        return self._add(Counter, name, doc, labels)

    def _gauge(self, name: str, doc: str, labels: tuple[str, ...]) -> Gauge:
        return self._add(Gauge, name, doc, labels)

    def _histogram(self, name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
        return self._add(Histogram, name, doc, labels, buckets=buckets)

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, kept: for series never removed."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _world(self, world: str | None) -> str:
        """The label for ``world``; on first sight, create its outcome series at 0 so rate() has data."""
        if world in self._worlds:
            return world  # a label already: world_label(w) == w
        w = world_label(world)
        if w not in self._worlds:
            self._worlds.add(w)
            if w in (UNKNOWN_WORLD, INVALID_WORLD):
                return w  # no branch behind it: it only ever has dead letters
            for outcome in ("applied", "duplicate"):
                self.events.labels(w, outcome, "")
            for commit_outcome in COMMIT_OUTCOMES:
                self.commits.labels(w, commit_outcome)
            self.occ_conflicts.labels(w)
            self.commit_retries_exhausted.labels(w)
            self.idempotency_lookups.labels(w)
            self.idempotency_duplicates.labels(w)
        return w

    # --- lag and latency ----------------------------------------------------------------------------
    def dead_letter_series(self, topics: Iterable[str], reasons: Iterable[str] = DEAD_LETTER_REASONS) -> None:
        """Create the (topic, reason) dead-letter series at 0, so a never-seen reason's first record is an
        increase from 0 (a series born at 500 has no increase() and would never alert)."""
        for topic in topics:
            for reason in reasons:
                self.dead_letters.labels(topic, reason_label(reason))

    def consumed(self, topic: str, n: int = 1) -> None:
        self._child(self.events_consumed, topic).inc(n)

    def inflight(self, world: str, count: int, oldest_consumed_at: float | None) -> None:
        """Set a world's in-flight count and when its oldest in-flight event was consumed.

        The applier counts in-flight events per process (offsets of a partition belong to many
        worlds) and reports them under the pseudo-world ``all`` (``ALL_WORLDS``); a scope like that
        must not get a world's outcome series, so this never creates them.
        """
        w = world if world in self._worlds or world == ALL_WORLDS else world_label(world)
        self._child(self.inflight_events, w).set(count)
        if count > 0 and oldest_consumed_at is not None:
            self.inflight_oldest.labels(w).set(oldest_consumed_at)
            self._oldest_shown.add(w)
        elif w in self._oldest_shown:
            self._oldest_shown.discard(w)
            try:
                self.inflight_oldest.remove(w)
            except KeyError:
                pass

    # --- event outcomes ----------------------------------------------------------------------------
    def event_outcome(self, world: str | None, outcome: EventOutcome, n: int = 1, *, reason: str | None = None) -> None:
        """Count ``n`` events of a world with one outcome; ``reason`` only for dead_lettered."""
        _check(outcome, EVENT_OUTCOMES, "event outcome")
        label = reason_label(reason) if outcome == "dead_lettered" else ""
        self._child(self.events, self._world(world), outcome, label).inc(n)

    def dead_lettered(self, topic: str, reason: str, *, world: str | None = None, n: int = 1) -> None:
        """A record went to the dead-letter topic: counts it by source topic and as an event outcome."""
        r = reason_label(reason)
        self._child(self.dead_letters, topic, r).inc(n)
        self._child(self.events, self._world(world), "dead_lettered", r).inc(n)

    def cdc_batch(
        self, *, skipped: Mapping[str, int], events: int, failures: Mapping[str, int], committed_at: float | None
    ) -> None:
        """One CDC ingest batch: skipped records by kind, events produced, failures, commit time."""
        for kind, n in skipped.items():
            self.cdc_skipped.labels(reason_label(kind)).inc(n)
        self.cdc_events.inc(events)
        for kind, n in failures.items():
            self.cdc_failures.labels(reason_label(kind)).inc(n)
        if committed_at is not None:
            self.cdc_last_commit.set(committed_at)

    def cdc_waiting_records(self, n: int) -> None:
        self.cdc_waiting.set(n)

    def set_parked(self, world: str, count: int) -> None:
        self._child(self.parked, self._world(world)).set(count)

    def released(self, world: str, waited_seconds: Iterable[float]) -> None:
        """Events left the causal gate after waiting ``waited_seconds`` each."""
        waits = [max(0.0, s) for s in waited_seconds]
        n = len(waits)
        observe_many(self.causal_wait, waits)
        if n:
            self._child(self.events, self._world(world), "released", "").inc(n)

    # --- Nessie commits ----------------------------------------------------------------------------
    def committed(
        self,
        world: str,
        *,
        duration_s: float,
        rows: int,
        nbytes: int,
        occurred_at: Iterable[float] = (),
        at: float | None = None,
        outcome: Literal["committed", "already_committed"] = "committed",
        unconverted: int = 0,
    ) -> None:
        """A world flush reached its branch: outcome, duration, batch size, freshness and e2e latency.

        ``occurred_at`` holds each event's ``occurred_at`` (Unix seconds) for the latency histogram,
        observed in one update per bucket (``observe_many``: ~0.2 µs per value).
        """
        w = self._world(world)
        now = time.time() if at is None else at
        self._child(self.commits, w, _check(outcome, COMMIT_OUTCOMES, "commit outcome")).inc()
        self._child(self.commit_duration, w).observe(duration_s)
        self.batch_rows.observe(rows)
        self.batch_bytes.observe(nbytes)
        self._child(self.last_commit, w).set(now)
        if unconverted:
            self.values_unconverted.labels(w).inc(unconverted)
        observe_many(self._child(self.e2e_latency, w), [max(0.0, now - t) for t in occurred_at])

    def flush_started(self, waited_s: float) -> None:
        """A world's flush took its batch, whose oldest event joined it ``waited_s`` ago."""
        self.flush_wait.observe(max(0.0, waited_s))

    def commit_failed(self, world: str, *, duration_s: float, retries_exhausted: bool) -> None:
        """A world flush gave up; nothing of it was acked."""
        w = self._world(world)
        self.commits.labels(w, "retries_exhausted" if retries_exhausted else "failed").inc()
        if retries_exhausted:
            self.commit_retries_exhausted.labels(w).inc()
        self.commit_duration.labels(w).observe(duration_s)

    def commit_retry(self, world: str, reason: str) -> None:
        """One commit attempt will be retried; a ``conflict`` also counts as an OCC conflict."""
        w = self._world(world)
        self.commit_retries.labels(w, _check(reason, RETRY_REASONS, "retry reason")).inc()
        if reason == "conflict":
            self.occ_conflicts.labels(w).inc()

    def last_commit_seen(self, world: str, at: float) -> None:
        """Seed freshness at start-up from the branch's head commit time, so a restart does not reset it."""
        self.last_commit.labels(self._world(world)).set(at)

    # --- consistency --------------------------------------------------------------------------------
    def idempotency(self, world: str, *, lookups: int, duplicates: int) -> None:
        """One dedupe round trip: ``lookups`` ids checked, ``duplicates`` of them already known."""
        w = self._world(world)
        self._child(self.idempotency_lookups, w).inc(lookups)
        self._child(self.idempotency_duplicates, w).inc(duplicates)

    def schema_versions(self, world: str, versions: Mapping[Layer, int]) -> int:
        """Set a world's version vector (per layer) and its max−min difference; returns the difference."""
        w = self._world(world)
        for layer, v in versions.items():
            self.schema_version.labels(w, _check(layer, LAYERS, "layer")).set(v)
        diff = max(versions.values()) - min(versions.values()) if versions else 0
        self.version_difference.labels(w).set(diff)
        return diff

    def schema_change(
        self, world: str, outcome: SchemaOutcome, *, reason: str | None = None, lag_s: float | None = None
    ) -> None:
        """Schema sync handled one change; ``lag_s`` (control event → branch commit) when applied."""
        w = self._world(world)
        label = reason_label(reason) if outcome == "refused" else ""
        self.schema_changes.labels(w, _check(outcome, SCHEMA_OUTCOMES, "schema outcome"), label).inc()
        if lag_s is not None:
            self.schema_sync_lag.labels(w).observe(max(0.0, lag_s))

    def reconciled(
        self,
        world: str,
        outcome: ReconcileOutcome,
        *,
        duration_s: float,
        drift: Mapping[str, int],
        repairs: int = 0,
        at: float | None = None,
    ) -> None:
        """A reconciliation run of one world finished; ``drift`` maps object type → count difference."""
        w = self._world(world)
        self.reconcile_runs.labels(w, _check(outcome, RECONCILE_OUTCOMES, "reconciliation outcome")).inc()
        self.reconcile_duration.observe(duration_s)
        for object_type, d in drift.items():
            self.reconcile_drift.labels(w, object_type).set(abs(d))
        if repairs:
            self.reconcile_repairs.labels(w).inc(repairs)
        self.reconcile_last_run.labels(w).set(time.time() if at is None else at)

    def merged(self, world: str, outcome: MergeOutcome, *, conflicts: int = 0) -> None:
        """A merge of ``world`` finished; ``conflicts`` counts conflicting keys it reported."""
        w = self._world(world)
        self.merges.labels(w, _check(outcome, MERGE_OUTCOMES, "merge outcome")).inc()
        if conflicts:
            self.merge_conflicts.labels(w).inc(conflicts)

    # --- dependencies -------------------------------------------------------------------------------
    def dependency(self, name: Dependency, up: bool) -> None:
        self._child(self.dependency_up, _check(name, DEPENDENCIES, "dependency")).set(1 if up else 0)


def series_bound(worlds: int, topics: int, object_types: int) -> int:
    """Most series one worker exports serving ``worlds`` worlds with at most ``object_types`` object types
    each, reading ``topics`` topics (histogram buckets included; docs/metrics.md "Series").

    Measured: 138 series with no world and two topics (40 of them the dead-letter series created at
    start-up); 150 more per world that has seen every outcome, every dead-letter reason, every retry
    reason, schema, reconciliation and merge outcome, and two object types. Worlds a worker does not
    serve must add none.
    """
    return 100 + 21 * topics + (160 + object_types) * worlds


_default: Metrics | None = None


def default_metrics() -> Metrics:
    """The process's metrics (created on first use); workers use this, tests build their own."""
    global _default
    if _default is None:
        _default = Metrics()
    return _default


def add_metrics_page(app: Any, metrics: Metrics, *, pattern: str = "/metrics") -> None:
    """Serve ``metrics.registry`` at ``pattern`` on a Faust app's web server.

    Only causeway's own metrics: Faust's sensors are not registered. Their names break Prometheus
    conventions (``faust_events_runtime_ms``, histograms without a unit, a gauge called
    ``faust_total_rebalances``, ``..._commited``) that ``promtool check metrics`` flags, and causeway's
    metrics cover what they show. ``*_created`` series are switched off process-wide: they double the
    series count and nothing here reads them.
    """
    from aiohttp.web import Response
    from prometheus_client import CONTENT_TYPE_LATEST

    from monitoring.exposition import Exposition

    disable_created_metrics()
    # generate_latest's bytes, without re-formatting every series at each scrape (monitoring/exposition.py).
    page = Exposition()

    @app.page(pattern)
    async def metrics_page(web: Any, request: Any) -> Any:
        return Response(body=page.render(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def serve(metrics: Metrics | Any, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve ``metrics.registry`` (a ``Metrics``, or anything with a registry) at ``http://addr:port/metrics``
    from a thread, without Faust.

    Returns the HTTP server (call ``shutdown()`` to stop it). ``*_created`` series are switched off.
    """
    from prometheus_client import start_http_server

    disable_created_metrics()
    server, _thread = start_http_server(port, addr, registry=metrics.registry)
    return server
