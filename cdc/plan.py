"""CDC ingest, the pure half: one batch of raw records → what to produce, what to dead-letter, what to count.

No I/O and no clock (``now_ms`` is passed in): ``agents/cdc.py`` wires this to Kafka. A raw record
becomes its change events (``cdc.convert.convert``), is skipped (counted), or is dead-lettered
with a reason; an event over its topic's size limit dead-letters its raw record as
``event-too-large``. Also here: the status a health check reads, the counters log line and the
start-up warning about topics too small for ``CAUSEWAY_MAX_EVENT_BYTES``.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cdc.convert import Converted, Ignored, Position, convert
from cdc.mapping import CdcMapping
from models.deadletter import DeadLetter, SourceRecord
from models.events import EntityKind
from streams.settings import Settings

# Bytes a record takes on the wire beyond its key, value and header bytes (record batch header and
# record framing are ~80; the rest is slack), for the pre-produce size check.
RECORD_OVERHEAD_BYTES = 256
TOO_LARGE = "event-too-large"


class RawRecord(SourceRecord, Protocol):
    """What the planner needs of a consumed record (aiokafka's ConsumerRecord has it)."""

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Outgoing:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None

    @property
    def wire_bytes(self) -> int:
        """An upper estimate of the record's size in a record batch (what ``max.message.bytes`` limits)."""
        size = len(self.key or b"") + len(self.value or b"") + RECORD_OVERHEAD_BYTES
        return size + sum(len(k) + len(v) + 8 for k, v in self.headers or ())


@dataclass
class BatchPlan:
    """What one batch produces, and what it counted."""

    outgoing: list[Outgoing] = field(default_factory=list)
    events: int = 0
    ignored: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    commit: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, partition) → next offset
    world_unchecked: Counter[str] = field(default_factory=Counter)  # table label → updates (see Converted)


def plan_batch(
    records: Iterable[RawRecord],
    mapping: CdcMapping,
    settings: Settings,
    now_ms: int,
    dlq_max_value_bytes: int = 900_000,
    limits: Mapping[str, int] | None = None,
    too_large: Mapping[tuple[str, int, int], str] | None = None,
) -> BatchPlan:
    """Convert a batch of raw records into the records to produce; pure (``now_ms`` is passed in).

    ``limits`` (topic → largest record it accepts, in bytes): a raw record whose output would exceed
    its topic's limit is dead-lettered as ``event-too-large`` instead. ``too_large`` (raw position →
    detail) dead-letters those records the same way (the broker refused their output).
    """
    plan = BatchPlan()
    topic_for = {EntityKind.OBJECT: settings.objects_topic, EntityKind.LINK: settings.links_topic}
    limits = limits or {}
    for rec in records:
        pos = Position(rec.topic, rec.partition, rec.offset)
        tp = (rec.topic, rec.partition)
        plan.commit[tp] = max(plan.commit.get(tp, 0), rec.offset + 1)
        refused = (too_large or {}).get((rec.topic, rec.partition, rec.offset))
        if refused is not None:
            _dead_letter(plan, rec, TOO_LARGE, refused, None, settings, now_ms, dlq_max_value_bytes)
            continue
        result = convert(rec.value, mapping, pos, settings.max_event_bytes)
        if isinstance(result, Converted):
            out = [Outgoing(topic_for[ev.event.kind], ev.key, ev.value) for ev in result.events]
            over = next((o for o in out if o.wire_bytes > limits.get(o.topic, sys.maxsize)), None)
            if over is not None:
                detail = (
                    f"the change event for {over.topic} takes about {over.wire_bytes} bytes; the topic "
                    f"accepts {limits[over.topic]} (max.message.bytes)"
                )
                world = result.events[0].event.world_id
                _dead_letter(plan, rec, TOO_LARGE, detail, world, settings, now_ms, dlq_max_value_bytes)
                continue
            plan.outgoing.extend(out)
            plan.events += len(result.events)
            if result.world_unchecked is not None:
                plan.world_unchecked[result.world_unchecked] += 1
        elif isinstance(result, Ignored):
            plan.ignored[result.kind] += 1
        else:
            _dead_letter(
                plan, rec, result.reason, result.detail, result.world_id, settings, now_ms, dlq_max_value_bytes,
                result.event_id,
            )  # fmt: skip
    return plan


def _dead_letter(
    plan: BatchPlan,
    rec: RawRecord,
    reason: str,
    detail: str,
    world_id: str | None,
    settings: Settings,
    now_ms: int,
    dlq_max_value_bytes: int,
    event_id: str | None = None,
) -> None:
    """Add the dead letter of a raw record to the plan; a value over the limit travels without its bytes."""
    dl = DeadLetter.of_record(
        rec,
        reason,
        detail,
        event_id=event_id,
        world_id=world_id,
        headers=list(rec.headers or ()),
        first_seen_ms=now_ms,
        max_value_bytes=dlq_max_value_bytes,
    )
    plan.dead_letters.append(dl)
    plan.rejected[reason] += 1
    plan.outgoing.append(Outgoing(settings.dlq_topic, dl.key, dl.value, dl.headers()))


@dataclass
class IngestStats:
    consumed: int = 0
    events: int = 0
    batches: int = 0
    commits: int = 0
    commit_failures: int = 0
    produce_failures: int = 0
    too_large: int = 0  # raw records dead-lettered as event-too-large
    refused_batches: int = 0  # batches the broker refused as too large, then produced one by one
    ignored: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    world_unchecked: Counter[str] = field(default_factory=Counter)  # table label → updates without before world


def unchecked_world_warning(label: str, mapping: CdcMapping) -> str:
    """The once-per-table warning for updates whose before image lacks the world column."""
    table = next((t for t in mapping.tables if t.label == label), None)
    column = table.world_column if table is not None else "?"
    where = (table.topic or dict(table.source).get("table")) if table is not None else label
    return (
        f"{label} ({where}) takes its world from column {column!r}, but its updates carry no before image "
        f"with that column: a row moved to another world stays live in the old one as well. Set REPLICA "
        f"IDENTITY FULL on the source table, or make {column!r} part of its primary key (docs/cdc.md)"
    )


@dataclass(frozen=True)
class IngestStatus:
    """What a health check needs of the ingest: is it committing, and is anything waiting?

    ``last_commit_at``: Unix time of the last offset commit (None before the first);
    ``records_waiting``: raw records on the assigned partitions not yet committed (broker high
    watermark minus the committed offset, as of the last fetch); ``last_failure``: the last produce
    or commit error, if any since the last commit. Degraded = records waiting and no commit for a while.
    """

    started_at: float | None
    last_commit_at: float | None
    records_waiting: int
    last_failure: str | None

    def stalled(self, now: float, after_s: float) -> bool:
        """True when records wait and the ingest has not committed for ``after_s`` seconds."""
        since = self.last_commit_at if self.last_commit_at is not None else self.started_at
        return self.records_waiting > 0 and since is not None and now - since > after_s


def limit_warnings(limits: Mapping[str, int], needed: Mapping[str, int]) -> list[str]:
    """One line per existing topic whose ``max.message.bytes`` is below what causeway may write to it."""
    return [
        f"topic {topic} has max.message.bytes={limits[topic]}, below the {want} bytes CAUSEWAY_MAX_EVENT_BYTES "
        f"needs: larger events are dead-lettered as {TOO_LARGE} (raise it with kafka-configs.sh "
        f"--alter --entity-type topics --entity-name {topic} --add-config max.message.bytes={want})"
        for topic, want in needed.items()
        if topic in limits and limits[topic] < want
    ]


def counters_line(before: IngestStats, now: IngestStats, seconds: float) -> str | None:
    """What the ingest did between two snapshots of its counters, as one line (None: nothing)."""
    if now.consumed == before.consumed and now.produce_failures == before.produce_failures:
        return None
    skipped = now.ignored - before.ignored
    rejected = now.rejected - before.rejected
    parts = [
        f"{now.consumed - before.consumed} records in {seconds:.0f}s",
        f"{now.events - before.events} events",
        "skipped " + (", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "0"),
        "dead-lettered " + (", ".join(f"{k} {v}" for k, v in sorted(rejected.items())) or "0"),
        f"produce failures {now.produce_failures - before.produce_failures}",
        f"commit failures {now.commit_failures - before.commit_failures}",
    ]
    return "; ".join(parts)
