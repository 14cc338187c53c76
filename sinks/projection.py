"""Projection rules: what a batch of change events does to the stored objects / links rows.

Pure functions, no I/O. The committer reads the stored ``(version, deleted)`` of the keys a batch
touches *at the head it is committing against*, calls :func:`plan`, and writes the result; on a
conflict it reads again at the new head and plans again, so nothing decided against an old head
survives a retry.

Rules, applied in batch order per key ``(entity_type, entity_pk)``:

* CREATE / UPDATE / SNAPSHOT: applied when the key is absent or ``version`` > the current version;
  the row becomes the event's ``after`` properties. Otherwise the event is stale and ignored.
* DELETE: same version rule; the row becomes a *tombstone* (``deleted = true``, version kept) so a
  late, older update cannot resurrect the entity.
* TRUNCATE (``entity_pk = "*"``): every row of that type is removed outright (tombstones too, so
  the type may start again at any version). Later events of the batch apply to the empty type.

Equal versions are stale: a redelivered event is a no-op.

Properties an event names as ``unchanged`` (the source did not send them) keep their previous
value: from an earlier event of the same batch here, else from the stored row (the committer reads
those only for the keys that need them, see :func:`needs_stored_properties`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from models.events import ChangeEvent, ChangeType

Key = tuple[str, str]  # (entity_type, entity_pk)


@dataclass(frozen=True, slots=True)
class Stored:
    """What the committer needs to know about a stored row."""

    version: int
    deleted: bool = False


@dataclass
class Plan:
    """The effect of a batch on one projection table."""

    rows: dict[Key, ChangeEvent] = field(default_factory=dict)  # key -> event whose row to write
    remove: set[Key] = field(default_factory=set)  # stored keys whose current row goes away
    truncated: set[str] = field(default_factory=set)
    stale: list[ChangeEvent] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.rows or self.remove)


def key_of(event: ChangeEvent) -> Key:
    return (event.entity_type, event.entity_pk)


def dedupe(events: Iterable[ChangeEvent]) -> list[ChangeEvent]:
    """Drop repeated event ids, keeping the first occurrence (batch order is causal order)."""
    seen: set[str] = set()
    out: list[ChangeEvent] = []
    for ev in events:
        if ev.event_id not in seen:
            seen.add(ev.event_id)
            out.append(ev)
    return out


def touched(events: Iterable[ChangeEvent]) -> tuple[set[Key], set[str]]:
    """The keys whose stored state a plan needs, and the truncated types (all their rows)."""
    keys: set[Key] = set()
    types: set[str] = set()
    for ev in events:
        if ev.change_type is ChangeType.TRUNCATE:
            types.add(ev.entity_type)
        else:
            keys.add(key_of(ev))
    return keys, types


def plan(events: Iterable[ChangeEvent], stored: Mapping[Key, Stored]) -> Plan:
    """Decide the batch's effect given the stored state of every touched key.

    ``stored`` must hold every stored row of the touched keys and of every truncated type; a key
    missing from it is taken as absent.
    """
    result = Plan()
    state: dict[Key, Stored | None] = {}

    def current(key: Key) -> Stored | None:
        return state[key] if key in state else stored.get(key)

    for ev in events:
        if ev.change_type is ChangeType.TRUNCATE:
            result.truncated.add(ev.entity_type)
            for key in list(stored) + list(state):
                if key[0] == ev.entity_type:
                    if key in stored:
                        result.remove.add(key)
                    state[key] = None
                    result.rows.pop(key, None)
            continue
        key = key_of(ev)
        cur = current(key)
        if cur is not None and ev.version <= cur.version:
            result.stale.append(ev)
            continue
        deleted = ev.change_type is ChangeType.DELETE
        if ev.unchanged and not deleted:
            earlier = result.rows.get(key)
            if earlier is not None and earlier.change_type is not ChangeType.DELETE:
                ev = carry_unchanged(ev, earlier.after or {})
        state[key] = Stored(ev.version, deleted)
        result.rows[key] = ev
        if key in stored:
            result.remove.add(key)
    return result


def carry_unchanged(ev: ChangeEvent, previous: Mapping[str, Any]) -> ChangeEvent:
    """``ev`` with its unchanged properties filled from ``previous``; those not found stay listed."""
    kept = {k: previous[k] for k in ev.unchanged if k in previous}
    if not kept:
        return ev
    after = {**kept, **(ev.after or {})}
    return replace(ev, after=after, unchanged=tuple(k for k in ev.unchanged if k not in kept))


def needs_stored_properties(p: Plan) -> set[Key]:
    """Keys whose planned row still lacks unchanged properties that only the stored row has.

    Never a key of a type the batch truncated: its planned row came after the truncate (earlier
    rows of the type were dropped), so the stored row it would copy from no longer exists.
    """
    return {
        key
        for key, ev in p.rows.items()
        if ev.unchanged and ev.change_type is not ChangeType.DELETE and key[0] not in p.truncated
    }
