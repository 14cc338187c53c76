"""Dedupe and version decisions of the change applier, given what Redis and the branch head answered.

Flow per batch (the agent does the I/O, these functions decide):

1. ``refs_to_check`` → one Redis round trip over the marks of the dedupe window (``agents.marks``,
   layout in ``agents.dedupe_window``); the ids found are *marked*. An id applied longer ago than
   the window is not found here: the committer catches such a copy (step 3: the version rule flags
   it, the branch's event log confirms it as a duplicate).
2. ``drop_duplicates`` removes events already marked for their world and repeats inside the batch.
3. At commit time, ``decide_versions`` against the entity versions read from the head being committed
   on (decided again after every OCC retry: a new head may hold newer versions).
4. After the Nessie commit, every event the batch settled is marked for the window, stale ones
   included. Publish the stale dead letters *before*
   setting the marks: a crash between the two would otherwise drop the redelivered copy as a
   duplicate, and the event would be neither applied nor dead-lettered.

Version rule: an event whose version is **lower than or equal to** the stored version of its entity is
not applied; it is dead-lettered with reason ``stale-version`` (and counted by that reason). Why not a
silent skip: the no-loss guarantee allows two outcomes per event (committed or dead-lettered with a
reason), a skip would be an invisible third, and the bad-input corpus expects a version regression in
the DLQ where producers can see it. Equal counts as stale because a *different* event id claiming a
version that is already stored is a producer error (a retry that minted a new id, or a fork of
history); the same event id never gets here, dedupe drops it first. A stale event is still *settled*:
its entity already holds a newer state, so the agent marks it in Redis and reports it to the causal
gate as taken effect (effects caused by it may go); a redelivery is then dropped as a duplicate instead
of filling the DLQ again. Past the dedupe window a copy of an applied event lands here as stale, and
the committer's event-log lookup then settles it as a duplicate (``CommitOutcome.duplicate_ids``).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agents.offset_tracker import Arrival, EventRef
from models.events import ChangeEvent, ChangeType

KEY_PREFIX = "causeway:applied:"
STALE_VERSION = "stale-version"

EntityRef = tuple[str, str, str, str]
"""(world_id, kind, entity_type, entity_pk): the entity whose version an event advances."""


def applied_key(world_id: str, event_id: str) -> str:
    """The previous format's per-event mark key, ``causeway:applied:{<world>}:<event_id>`` (read until it expires).

    The braces make the world the key's hash tag: on Redis Cluster a world's marks share one slot,
    so one script or ``MGET`` per world stays in one slot.
    """
    return f"{KEY_PREFIX}{{{world_id}}}:{event_id}"


def legacy_applied_key(world_id: str, event_id: str) -> str:
    """The key format before the hash tag, ``causeway:applied:<world>:<event_id>`` (read until it expires)."""
    return f"{KEY_PREFIX}{world_id}:{event_id}"


def parse_applied_key(key: str) -> EventRef:
    """(world_id, event_id) from an ``applied_key`` of either format; event ids may hold ``:``."""
    if not key.startswith(KEY_PREFIX):
        raise ValueError(f"not an applied-event key: {key[:80]!r}")
    rest = key[len(KEY_PREFIX) :]
    if rest.startswith("{"):
        world_id, sep, event_id = rest[1:].partition("}:")
    else:
        world_id, sep, event_id = rest.partition(":")
    if not sep or not world_id or not event_id:
        raise ValueError(f"not an applied-event key: {key[:80]!r}")
    return (world_id, event_id)


def refs_to_check(arrivals: Iterable[Arrival], extra: Iterable[EventRef] = ()) -> list[EventRef]:
    """Every ref one lookup should cover: the events, their causes (same world) and ``extra``, unique.

    ``extra`` is meant for ``CausalGate.unknown_causes()``, so dedupe and cause discovery share one
    Redis round trip.
    """
    seen: dict[EventRef, None] = {}
    for arrival in arrivals:
        seen.setdefault(arrival.ref, None)
        if arrival.event.caused_by is not None:
            seen.setdefault((arrival.event.world_id, arrival.event.caused_by), None)
    for ref in extra:
        seen.setdefault(ref, None)
    return list(seen)


@dataclass(frozen=True, slots=True)
class Deduped:
    """The split of a batch: events to process, and copies to drop (their offsets are done at once)."""

    fresh: list[Arrival] = field(default_factory=list)
    duplicates: list[Arrival] = field(default_factory=list)


def drop_duplicates(arrivals: Iterable[Arrival], marked: Container[EventRef]) -> Deduped:
    """Drop events already marked in their world, and repeats within the batch (the first copy stays)."""
    if not marked:
        # Most polls: nothing marked and no repeats, found by one set built in C rather than a
        # Python loop of two lookups and an append per event.
        listed = list(arrivals)
        if len({a.ref for a in listed}) == len(listed):
            return Deduped(listed, [])
        arrivals = listed
    fresh: list[Arrival] = []
    duplicates: list[Arrival] = []
    kept: set[EventRef] = set()
    for arrival in arrivals:
        ref = arrival.ref
        if ref in marked or ref in kept:
            duplicates.append(arrival)
        else:
            kept.add(ref)
            fresh.append(arrival)
    return Deduped(fresh, duplicates)


def marks_after_commit(settled: Iterable[EventRef]) -> list[str]:
    """Per-event mark keys (the previous format) of the events a commit settled, unique."""
    return [applied_key(world_id, event_id) for world_id, event_id in dict.fromkeys(settled)]


# --- the version rule -----------------------------------------------------------------------------


def entity_ref(event: ChangeEvent) -> EntityRef:
    """The entity an event changes; a TRUNCATE's pk is ``*`` (the whole type)."""
    return (event.world_id, event.kind.value, event.entity_type, event.entity_pk)


def entities_of(arrivals: Iterable[Arrival]) -> list[EntityRef]:
    """The entities whose stored versions ``decide_versions`` needs, unique, TRUNCATEs left out."""
    refs = (entity_ref(a.event) for a in arrivals if a.event.change_type is not ChangeType.TRUNCATE)
    return list(dict.fromkeys(refs))


@dataclass(frozen=True, slots=True)
class StaleEvent:
    """An event the version rule refused; ``detail`` goes into the dead-letter headers."""

    arrival: Arrival
    stored_version: int
    detail: str
    reason: str = STALE_VERSION


@dataclass(frozen=True, slots=True)
class VersionDecision:
    """The events to write, in their input order, and the stale ones to dead-letter."""

    apply: list[Arrival] = field(default_factory=list)
    stale: list[StaleEvent] = field(default_factory=list)


def is_stale(version: int, stored: int | None) -> bool:
    """The rule itself: an event is stale when an equal or newer version is already stored."""
    return stored is not None and version <= stored


def decide_versions(batch: Sequence[Arrival], stored: Mapping[EntityRef, int]) -> VersionDecision:
    """Apply the version rule to a batch in its order, against the versions read from the branch head.

    ``stored`` maps entities to their current version on the head, including deleted entities (their
    last version must be kept as a tombstone, or a late update would resurrect them). Events earlier in
    the batch count as stored for later ones. A TRUNCATE always applies and clears the versions of its
    (world, kind, type) for the rest of the batch, because the rows it deletes no longer hold versions.
    """
    running: dict[EntityRef, int] = {}
    truncated: set[tuple[str, str, str]] = set()
    apply: list[Arrival] = []
    stale: list[StaleEvent] = []
    for arrival in batch:
        event = arrival.event
        ent = entity_ref(event)
        scope = ent[:3]
        if event.change_type is ChangeType.TRUNCATE:
            truncated.add(scope)
            for key in [k for k in running if k[:3] == scope]:
                del running[key]
            apply.append(arrival)
            continue
        current = running.get(ent)
        if current is None and scope not in truncated:
            current = stored.get(ent)
        if is_stale(event.version, current):
            assert current is not None
            relation = "equals" if event.version == current else "is older than"
            detail = (
                f"version {event.version} {relation} the stored version {current} of "
                f"{event.entity_type} {event.entity_pk!r}; a newer state is not overwritten"
            )
            stale.append(StaleEvent(arrival, current, detail))
            continue
        running[ent] = event.version
        apply.append(arrival)
    return VersionDecision(apply, stale)
