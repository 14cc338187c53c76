"""The panels of causeway's Grafana dashboards, as data: query, unit, description, empty-at-rest.

``monitoring.dashboards`` turns them into Grafana JSON. A panel whose query may return nothing while a
healthy worker runs under ordinary load says why in ``empty_at_rest``; the reason lands in the panel
description and in its ``causeway`` field, which ``monitoring.promql_check`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RI = "$__rate_interval"
W = 'world=~"$world"'
WA = 'world=~"($world)|all"'  # also the per-process in-flight series (world="all")
T = 'topic=~"$topic"'
UP = '(up{job="causeway"} == 1)'
NO_WORKER = "No data: no worker answers scrapes (stopped, stalled or not discovered)"
NO_LAG = "No data: the lag exporter is not scraped, so lag is not measured"


def live(rate: str) -> str:
    """``rate`` (a per-instance rate) kept only for workers answering scrapes right now.

    Without this, rate() over a window that ends at a worker's last good scrape keeps showing its old
    throughput and latency for the whole window after the worker stalled.
    """
    return f"({rate} and on (instance) {UP})"


@dataclass(frozen=True)
class Q:
    """One query of a panel: PromQL with Grafana variables, and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Q, ...]
    empty_at_rest: str = ""  # why the query may be empty while a healthy worker runs; "" = never
    kind: str = "timeseries"
    thresholds: tuple[tuple[str, float], ...] = ()  # (colour, from value) after the base green
    width: int = 12
    no_value: str = ""  # what the panel says when the query returns nothing (Grafana's noValue)
    extra: dict[str, Any] = field(default_factory=dict)


def _quantiles(
    metric: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.95, 0.99), selector: str = W
) -> tuple[Q, ...]:
    group = f"{by}, le" if by else "le"
    prefix = "{{" + by + "}} " if by else ""
    return tuple(
        Q(
            f"histogram_quantile({q}, sum by ({group}) " + live(f"rate({metric}_bucket{{{selector}}}[{RI}])") + ")",
            f"{prefix}p{int(q * 100)}",
        )
        for q in qs
    )


def _mean(metric: str) -> Q:
    return Q(f"sum(rate({metric}_sum[{RI}])) / sum(rate({metric}_count[{RI}]))", "mean")


SCHEMA_SYNC_ONLY = (
    "set by schema sync (issue 7) for the worlds it has synced; the change-applier worker alone "
    "exports no schema versions"
)

OVERVIEW = (
    Panel(
        "Consumed records/s by topic",
        "Records read from Kafka per second, before decoding.",
        "ops",
        (Q("sum by (topic) " + live(f"rate(causeway_events_consumed_total{{{T}}}[{RI}])"), "{{topic}}"),),
        no_value=NO_WORKER,
    ),
    Panel(
        "Applied events/s by world",
        "Events that took effect on their world branch, per second.",
        "ops",
        (Q("sum by (world) " + live(f'rate(causeway_events_total{{{W}, outcome="applied"}}[{RI}])'), "{{world}}"),),
        no_value=NO_WORKER,
    ),
    Panel(
        "Consumer lag by topic",
        "Messages each consumer group has not committed (end offset − committed offset), summed over "
        "partitions, measured from the broker by the lag exporter (it keeps counting while a worker "
        "is stopped). Alerts: CausewayConsumerLagHigh (>1,000 for 5m), CausewayConsumerLagCritical "
        "(>10,000 for 2m), CausewayLagAbsent (no lag series).",
        "short",
        (
            Q(
                f"sum by (group, topic) (max by (group, topic, partition) (causeway_consumer_lag_messages{{{T}}}))",
                "{{group}} {{topic}}",
            ),
        ),
        thresholds=(("yellow", 1000), ("red", 10000)),
        no_value=NO_LAG,
    ),
    Panel(
        "Consumer time lag",
        "How long the oldest record a group has not committed has waited since it was written; 0 when "
        "caught up. Rate-independent: a healthy worker keeps it at a few seconds at any rate. Alerts: "
        "CausewayConsumerLagSecondsHigh (>60 s for 1m), CausewayConsumerLagSecondsCritical (>5 min for 2m).",
        "s",
        (Q(f"max by (group, topic) (causeway_consumer_lag_seconds{{{T}}})", "{{group}} {{topic}}"),),
        thresholds=(("yellow", 60), ("red", 300)),
        no_value=NO_LAG,
    ),
    Panel(
        "Consumer lag by partition",
        "Lag of each partition; one hot partition shows up here.",
        "short",
        (
            Q(
                f"max by (group, topic, partition) (causeway_consumer_lag_messages{{{T}}})",
                "{{group}} {{topic}}/{{partition}}",
            ),
        ),
        no_value=NO_LAG,
    ),
    Panel(
        "End-to-end latency",
        "Event occurred_at (producer clock) to the Nessie commit that applied it (workers answering scrapes).",
        "s",
        _quantiles("causeway_e2e_latency_seconds"),
        no_value=NO_WORKER,
    ),
    Panel(
        "Commit duration",
        "One world flush from first attempt to final outcome, retries included.",
        "s",
        _quantiles("causeway_commit_duration_seconds"),
        no_value=NO_WORKER,
    ),
    Panel(
        "Commits/s by outcome",
        "World flushes by final outcome: committed, already_committed (an unknown outcome that a check "
        "found committed), retries_exhausted, failed.",
        "ops",
        (Q("sum by (outcome) " + live(f"rate(causeway_commits_total{{{W}}}[{RI}])"), "{{outcome}}"),),
        no_value=NO_WORKER,
    ),
    Panel(
        "In-flight events",
        "Events consumed but not yet committed (buffered, parked or committing). A worker that "
        "counts them per process rather than per world (the change applier does: one partition "
        'carries many worlds) reports world "all", which every world selection includes.',
        "short",
        (Q(f"sum by (world) (causeway_inflight_events{{{WA}}})", "{{world}}"),),
    ),
    Panel(
        "Oldest in-flight event age",
        "How long the oldest consumed-but-uncommitted event of a world has waited (a batch that cannot "
        'flush keeps ageing here; world "all": a whole worker). Alert: CausewayWorldStale.',
        "s",
        (Q(f"time() - min by (world) (causeway_inflight_oldest_timestamp_seconds{{{WA}}})", "{{world}}"),),
        empty_at_rest="the series exists only while a world has events in flight; between flushes "
        "a lightly loaded world has none",
        thresholds=(("yellow", 60),),
    ),
    Panel(
        "Batch rows",
        "Events per committed world flush.",
        "short",
        (*_quantiles("causeway_batch_rows", qs=(0.5, 0.99), selector=""), _mean("causeway_batch_rows")),
    ),
    Panel(
        "Batch bytes",
        "Data-file bytes written per committed world flush.",
        "bytes",
        (*_quantiles("causeway_batch_bytes", qs=(0.5, 0.99), selector=""), _mean("causeway_batch_bytes")),
    ),
    Panel(
        "Dependencies",
        "1 when every worker's last health probe of Redis, Nessie or Kafka succeeded. Alert: CausewayDependencyDown.",
        "bool_on_off",
        (Q("min by (dependency) (causeway_dependency_up)", "{{dependency}}"),),
        kind="stat",
        width=6,
    ),
    Panel(
        "Workers up",
        "Workers answering scrapes, out of those discovered (each running worker registers itself). "
        "Alerts: CausewayWorkerDown, CausewayWorkersAbsent.",
        "short",
        (Q('sum(up{job="causeway"})', "up"), Q('count(up{job="causeway"})', "discovered")),
        no_value="No worker is running (none discovered)",
        kind="stat",
        width=6,
    ),
)

CONSISTENCY = (
    Panel(
        "Schema version by layer",
        "Schema version the control, data and intelligence layers have reached per world (the version vector).",
        "short",
        (Q(f"max by (world, layer) (causeway_schema_version{{{W}}})", "{{world}} {{layer}}"),),
        empty_at_rest=SCHEMA_SYNC_ONLY,
    ),
    Panel(
        "Version vector difference",
        "Largest minus smallest layer version per world. Alert: CausewayVersionVectorDiverged (>5).",
        "short",
        (Q(f"max by (world) (causeway_version_vector_difference{{{W}}})", "{{world}}"),),
        empty_at_rest=SCHEMA_SYNC_ONLY,
        thresholds=(("yellow", 5),),
    ),
    Panel(
        "Schema changes by outcome",
        "Schema changes handled by schema sync: applied, duplicate, waiting "
        "(a version gap), refused (incompatible; reason). Alert: CausewaySchemaChangeRefused.",
        "ops",
        (
            Q(
                f"sum by (outcome, reason) (rate(causeway_schema_changes_total{{{W}}}[{RI}]))",
                "{{outcome}} {{reason}}",
            ),
        ),
        empty_at_rest="series appear with the first schema change a worker handles",
    ),
    Panel(
        "Schema sync lag",
        "Control-plane schema.updated to the change committed on the world branch.",
        "s",
        _quantiles("causeway_schema_sync_lag_seconds", qs=(0.5, 0.95)),
        empty_at_rest="no value until a schema change has been applied",
    ),
    Panel(
        "Reconciliation runs by outcome",
        "Runs in the last hour: ok, repaired, failed. Alert: CausewayReconciliationFailing.",
        "short",
        (Q(f"sum by (outcome) (increase(causeway_reconciliation_runs_total{{{W}}}[1h]))", "{{outcome}}"),),
        empty_at_rest="reconciliation first runs one interval (5 min by default) after start",
    ),
    Panel(
        "Reconciliation drift",
        "Largest count difference among control plane, projection and event "
        "log, per world and object type, from the last run.",
        "short",
        (
            Q(
                f"max by (world, object_type) (causeway_reconciliation_drift{{{W}}})",
                "{{world}} {{object_type}}",
            ),
        ),
        empty_at_rest="set by the first reconciliation run",
    ),
    Panel(
        "Reconciliation repairs",
        "Projections rebuilt from the event log in the last hour.",
        "short",
        (Q(f"sum by (world) (increase(causeway_reconciliation_repairs_total{{{W}}}[1h]))", "{{world}}"),),
        empty_at_rest="only drift past the threshold causes a repair",
    ),
    Panel(
        "Reconciliation duration",
        "One reconciliation run of one world.",
        "s",
        _quantiles("causeway_reconciliation_duration_seconds", qs=(0.5, 0.95), selector=""),
        empty_at_rest="no value until a run has finished in the rate window",
    ),
    Panel(
        "Time since last reconciliation",
        "Seconds since each world's last reconciliation run finished. Alert: CausewayReconciliationStale (>15 min).",
        "s",
        (
            Q(
                f"time() - max by (world) (causeway_reconciliation_last_run_timestamp_seconds{{{W}}})",
                "{{world}}",
            ),
        ),
        empty_at_rest="set by the first reconciliation run",
        thresholds=(("yellow", 900),),
    ),
    Panel(
        "Idempotency hit ratio",
        "Share of dedupe lookups that found the event id already applied. "
        "Normal < 1%. Alert: CausewayIdempotencyHitRateHigh (>10%).",
        "percentunit",
        (
            Q(
                f"sum by (world) (rate(causeway_idempotency_duplicates_total{{{W}}}[{RI}])) / "
                f"sum by (world) (rate(causeway_idempotency_lookups_total{{{W}}}[{RI}]))",
                "{{world}}",
            ),
        ),
        thresholds=(("yellow", 0.01), ("red", 0.1)),
    ),
    Panel(
        "Idempotency lookups and duplicates",
        "Dedupe lookups and hits per second.",
        "ops",
        (
            Q(f"sum(rate(causeway_idempotency_lookups_total{{{W}}}[{RI}]))", "lookups"),
            Q(f"sum(rate(causeway_idempotency_duplicates_total{{{W}}}[{RI}]))", "duplicates"),
        ),
    ),
    Panel(
        "Merge conflict ratio",
        "Share of world merges in the last hour that reported conflicts. Alert: CausewayMergeConflictRateHigh (>10%).",
        "percentunit",
        (
            Q(
                f'sum by (world) (rate(causeway_merges_total{{{W}, outcome="conflict"}}[1h])) / '
                f"sum by (world) (rate(causeway_merges_total{{{W}}}[1h]))",
                "{{world}}",
            ),
        ),
        empty_at_rest="merges are operator actions (wave 2); none happen under ordinary load",
        thresholds=(("red", 0.1),),
    ),
)

WORLDS = (
    Panel(
        "Commits/s per world (branch)",
        "Successful commits to each world's Nessie branch per second.",
        "ops",
        (
            Q(
                f'sum by (world) (rate(causeway_commits_total{{{W}, outcome=~"committed|already_committed"}}[{RI}]))',
                "{{world}}",
            ),
        ),
    ),
    Panel(
        "Freshness per world",
        "Seconds since the last commit to each world's branch, computed in PromQL "
        "so it keeps growing while a worker is stuck. Alert: CausewayWorldStale (>60 s with events in "
        "flight).",
        "s",
        (Q(f"time() - max by (world) (causeway_world_last_commit_timestamp_seconds{{{W}}})", "{{world}}"),),
        thresholds=(("yellow", 60),),
    ),
    Panel(
        "Events/s per world by outcome",
        "Applied, duplicate, parked, released and dead-lettered events.",
        "ops",
        (Q(f"sum by (world, outcome) (rate(causeway_events_total{{{W}}}[{RI}]))", "{{world}} {{outcome}}"),),
    ),
    Panel(
        "End-to-end latency p95 per world",
        "95th percentile of occurred_at → commit, per world.",
        "s",
        _quantiles("causeway_e2e_latency_seconds", by="world", qs=(0.95,)),
    ),
    Panel(
        "OCC conflicts/s per world",
        "Nessie commit attempts refused with 409 (another writer moved the branch).",
        "ops",
        (Q(f"sum by (world) (rate(causeway_occ_conflicts_total{{{W}}}[{RI}]))", "{{world}}"),),
    ),
    Panel(
        "Commit retries/s by reason",
        "Retried commit attempts: conflict, unknown_state, transient.",
        "ops",
        (
            Q(
                f"sum by (world, reason) (rate(causeway_commit_retries_total{{{W}}}[{RI}]))",
                "{{world}} {{reason}}",
            ),
        ),
        empty_at_rest="series appear with the first retried commit; a single writer per world rarely retries",
    ),
    Panel(
        "Retries exhausted (1h)",
        "Flushes that gave up after their OCC retries in the last hour. Alert: CausewayCommitRetriesExhausted.",
        "short",
        (Q(f"sum by (world) (increase(causeway_commit_retries_exhausted_total{{{W}}}[1h]))", "{{world}}"),),
    ),
    Panel(
        "Merge conflicts (1h)",
        "Conflicting keys reported by merges of each world in the last hour.",
        "short",
        (Q(f"sum by (world) (increase(causeway_merge_conflicts_total{{{W}}}[1h]))", "{{world}}"),),
        empty_at_rest="merges are operator actions (wave 2); none happen under ordinary load",
    ),
)

CAUSAL = (
    Panel(
        "Parked events",
        "Events waiting in the causal gate for their cause, per world.",
        "short",
        (Q(f"sum by (world) (causeway_parked_events{{{W}}})", "{{world}}"),),
    ),
    Panel(
        "Parked and released/s",
        "Events entering and leaving the causal gate per second.",
        "ops",
        (
            Q(
                f'sum by (outcome) (rate(causeway_events_total{{{W}, outcome=~"parked|released"}}[{RI}]))',
                "{{outcome}}",
            ),
        ),
        empty_at_rest="only an event whose cause has not been applied yet is parked",
    ),
    Panel(
        "Causal wait",
        "Time an event waited in the causal gate before release.",
        "s",
        _quantiles("causeway_causal_wait_seconds", qs=(0.5, 0.95, 0.99), selector=""),
        empty_at_rest="no value unless events were released in the rate window",
    ),
    Panel(
        "Dead letters/s by topic and reason",
        "Records sent to the dead-letter topic. Workers create every known (topic, reason) series at 0 "
        "at start-up. Alert: CausewayDeadLetters (any, including a reason never seen before).",
        "ops",
        (
            Q(
                f"sum by (topic, reason) (rate(causeway_dead_letters_total{{{T}}}[{RI}]))",
                "{{topic}} {{reason}}",
            ),
        ),
        no_value=NO_WORKER,
    ),
    Panel(
        "Dead-lettered events/s by world",
        "Dead-lettered change events per world and reason (world 'unknown' or 'invalid' when none could be read).",
        "ops",
        (
            Q(
                f'sum by (world, reason) (rate(causeway_events_total{{{W}, outcome="dead_lettered"}}[{RI}]))',
                "{{world}} {{reason}}",
            ),
        ),
        empty_at_rest="series appear with the first dead letter; healthy input has none",
    ),
    Panel(
        "Dead letters (24h)",
        "Records dead-lettered in the last 24 hours from the selected topics; 0 when none.",
        "short",
        (Q(f"sum(increase(causeway_dead_letters_total{{{T}}}[24h])) or vector(0)", "dead letters"),),
        kind="stat",
        thresholds=(("red", 1),),
    ),
)
