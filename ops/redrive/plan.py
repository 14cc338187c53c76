"""Dead-letter selection and redrive decisions (pure: the I/O is in ``ops.redrive.run``).

A redrive re-publishes a dead letter to the topic it was read from, with its original key, value
and headers, plus ``causeway.redrive_count`` = previous count + 1 (and where it came from in the
DLQ, for the audit trail). Each letter gets one decision:

* ``redrive`` – publish it;
* ``invalid`` – it still fails validation (``models.events.decode``); only ``--force`` sends it;
* ``applied`` – its event already took effect in its world (Redis mark): sending it again would be
  a harmless duplicate, so it is skipped and reported;
* ``world-missing`` – an unknown-world letter whose world still has no branch (fix the cause first,
  or ``--force``);
* ``cause-missing`` – a cause-missing letter whose cause is still nowhere: no Redis mark, not in
  its world branch's event log, and not redriven with it (redrive the cause first, or ``--force``);
* ``stale`` – a stale-version letter: its event was settled as older than the stored version (it
  carries a mark); sending it again would only dead-letter it again;
* ``already-redriven`` – this DLQ record was redriven before (the redrive ledger); ``--again``
  sends it anyway;
* ``no-origin`` – the letter does not say which topic it came from.

**One letter per origin.** The dead-letter topic is at-least-once: a worker that crashes after
publishing a letter but before committing its source offset re-reads the record and dead-letters
it again. Letters with the same origin (source topic, partition, offset) are one letter to the
operator: :func:`collapse` keeps the first and lists the other copies' DLQ positions, a filter
matches the group, and a redrive sends it once and records every copy in the ledger.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from models.deadletter import H_REDRIVE, OUR_PREFIX, DeadLetter
from models.events import ChangeEvent, EntityKind, Invalid, decode

H_REDRIVEN_FROM = "causeway.redriven_from"  # "<dlq topic>/<partition>@<offset>"
UNKNOWN_WORLD = "unknown-world"
CAUSE_MISSING = "cause-missing"
STALE_VERSION = "stale-version"


@dataclass(frozen=True)
class DlqRecord:
    """A dead letter and where it sits in the DLQ topic."""

    partition: int
    offset: int
    timestamp_ms: int
    letter: DeadLetter
    copies: tuple[str, ...] = ()  # DLQ positions of later letters with the same origin

    @property
    def ref(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def refs(self) -> tuple[str, ...]:
        """This letter's DLQ position and its copies'."""
        return (self.ref, *self.copies)

    @property
    def origin(self) -> tuple[str, int, int] | None:
        """(source topic, partition, offset), or None when the letter does not say."""
        dl = self.letter
        return (dl.topic, dl.partition, dl.offset) if dl.topic else None


def collapse(records: Iterable[DlqRecord]) -> list[DlqRecord]:
    """One record per origin, in DLQ order: the first letter, with the later copies' refs attached.

    Letters without an origin are kept as they are (nothing says two of them are the same record).
    """
    first: dict[tuple[str, int, int], int] = {}
    out: list[DlqRecord] = []
    for rec in records:
        key = rec.origin
        if key is None:
            out.append(rec)
        elif key in first:
            i = first[key]
            out[i] = replace(out[i], copies=(*out[i].copies, rec.ref))
        else:
            first[key] = len(out)
            out.append(rec)
    return out


@dataclass(frozen=True)
class DlqFilter:
    reasons: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    worlds: tuple[str, ...] = ()
    since_ms: int | None = None
    until_ms: int | None = None
    refs: tuple[str, ...] = ()  # "partition:offset" in the DLQ
    event_ids: tuple[str, ...] = ()

    def matches(self, rec: DlqRecord) -> bool:
        dl = rec.letter
        seen = dl.first_seen_ms or rec.timestamp_ms
        return (
            (not self.reasons or dl.reason in self.reasons)
            and (not self.topics or dl.topic in self.topics)
            and (not self.worlds or (dl.world_id or "") in self.worlds)
            and (self.since_ms is None or seen >= self.since_ms)
            and (self.until_ms is None or seen < self.until_ms)
            and (not self.refs or any(r in self.refs for r in rec.refs))
            and (not self.event_ids or (dl.event_id or "") in self.event_ids)
        )


@dataclass(frozen=True)
class Decision:
    record: DlqRecord
    action: str  # redrive | invalid | applied | stale | world-missing | cause-missing | already-redriven | no-origin
    detail: str = ""
    event: ChangeEvent | None = None

    @property
    def send(self) -> bool:
        return self.action == "redrive"


def topic_kind(topic: str, objects_topic: str, links_topic: str) -> EntityKind | None:
    return {objects_topic: EntityKind.OBJECT, links_topic: EntityKind.LINK}.get(topic)


def decide(
    rec: DlqRecord,
    *,
    kind: EntityKind | None,
    max_bytes: int,
    applied: Collection[tuple[str, str]],
    worlds_present: Collection[str],
    redriven: Collection[str],
    causes_present: Collection[tuple[str, str]] = (),
    force: bool = False,
    again: bool = False,
) -> Decision:
    """What to do with one dead letter, given what Redis and Nessie said (see the module docstring)."""
    dl = rec.letter
    if not dl.topic:
        return Decision(rec, "no-origin", "the letter has no causeway.source.topic header")
    if any(r in redriven for r in rec.refs) and not again:
        return Decision(rec, "already-redriven", "redriven before; --again sends it once more")
    result = decode(dl.value, dl.key, kind, max_bytes)
    if isinstance(result, Invalid):
        if force:
            return Decision(rec, "redrive", f"forced although invalid: {result.reason}")
        return Decision(rec, "invalid", f"{result.reason}: {result.detail}")
    if (result.world_id, result.event_id) in applied:
        if dl.reason == STALE_VERSION:
            return Decision(rec, "stale", "older than the stored version; it would be dead-lettered again", result)
        return Decision(rec, "applied", f"event {result.event_id} already applied in world {result.world_id}", result)
    if dl.reason == UNKNOWN_WORLD and result.world_id not in worlds_present and not force:
        return Decision(
            rec,
            "world-missing",
            f"world {result.world_id!r} still has no branch; `causeway worlds create {result.world_id}` first",
            result,
        )
    cause = result.caused_by
    if dl.reason == CAUSE_MISSING and cause and (result.world_id, cause) not in causes_present and not force:
        return Decision(
            rec,
            "cause-missing",
            f"cause {cause} is still not applied in world {result.world_id} (no mark, not in its event log, "
            "not redriven with it); redrive the cause first, or --force",
            result,
        )
    return Decision(rec, "redrive", "", result)


def causes_wanted(records: Iterable[DlqRecord], events: dict[str, ChangeEvent]) -> set[tuple[str, str]]:
    """(world, cause event id) of the cause-missing letters among ``records`` (``events`` by ref)."""
    return {
        (ev.world_id, ev.caused_by)
        for r in records
        if r.letter.reason == CAUSE_MISSING and (ev := events.get(r.ref)) is not None and ev.caused_by
    }


def redrive_headers(rec: DlqRecord, dlq_topic: str) -> list[tuple[str, bytes]]:
    """The original headers plus the incremented redrive count and the DLQ position it came from."""
    dl = rec.letter
    out = [(k, v) for k, v in dl.original_headers if not k.startswith(OUR_PREFIX)]
    out.append((H_REDRIVE, str(dl.redrive_count + 1).encode()))
    out.append((H_REDRIVEN_FROM, f"{dlq_topic}/{rec.partition}@{rec.offset}".encode()))
    return out


def fmt_ms(ms: int) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
