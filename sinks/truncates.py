"""The TRUNCATE duplicate guard: which events of a batch may be copies of events a TRUNCATE hid.

A TRUNCATE removes its type's keys with their versions and tombstones, so a copy (another offset,
its Redis mark lost) of an event applied before it would pass the version rule and be applied a
second time. The branch records, in ``entity_events``'s ``TRUNCATED_PROPERTY``, each truncated
type scope with its *ceiling*: the highest version a truncate of it removed. A copy carries its
original's version, so only events at or below the ceiling are looked up by id in the log; the
common case (updates above every version the type had when it was truncated) reads nothing.

The ceiling is read from the log once per truncate commit (the type's log rows before it) and once
on a branch written before the ceilings were recorded; the rest is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson
from pyiceberg.table import Table

from models.events import ChangeEvent, ChangeType
from sinks.tables import TRUNCATED_PROPERTY


def truncate_guard(table: Table, events: Sequence[ChangeEvent]) -> tuple[set[str], str | None]:
    """The ids of ``events`` to look up in the log before the projection (possible copies of
    events a TRUNCATE hid), and the new ``TRUNCATED_PROPERTY`` value (None: unchanged).

    Reads the log only when a ceiling is not known yet: once per truncate commit, and once on a
    branch written before the ceilings (or before the property)."""
    known = truncate_ceilings(table)
    ceilings = dict(known) if known is not None else dict.fromkeys(logged_truncates(table))
    hidden = truncated_before(events)
    unknown = {scope for scope, c in ceilings.items() if c is None} | set(hidden)
    if unknown:
        ceilings = raise_ceilings(ceilings, logged_ceilings(table, unknown))
    suspects = truncate_suspects(events, ceilings)
    ceilings = raise_ceilings(ceilings, hidden)
    return suspects, (dumps_ceilings(ceilings) if ceilings != known else None)


def type_scope(event: ChangeEvent) -> str:
    """``<kind>/<type>``: what a TRUNCATE clears, as ``TRUNCATED_PROPERTY`` lists it."""
    return f"{event.kind.value}/{event.entity_type}"


def truncate_ceilings(table: Table) -> dict[str, int | None] | None:
    """``TRUNCATED_PROPERTY``: each truncated type scope's version ceiling, None when not known
    (a branch written while the property was a plain list); None on a branch written before it."""
    raw = table.metadata.properties.get(TRUNCATED_PROPERTY)
    if raw is None:
        return None
    parsed = orjson.loads(raw)
    if isinstance(parsed, list):
        return dict.fromkeys(parsed)
    return {scope: int(c) for scope, c in parsed.items()}


def dumps_ceilings(ceilings: Mapping[str, int | None]) -> str:
    return orjson.dumps(dict(ceilings), option=orjson.OPT_SORT_KEYS).decode()


def truncated_before(events: Sequence[ChangeEvent]) -> dict[str, int]:
    """Per type scope the batch truncates: the highest version among its events up to the last
    TRUNCATE of the scope in the batch (the TRUNCATE's own included), i.e. what that truncate hid.

    Events after the last truncate stay in the projection, so the version rule guards them."""
    out: dict[str, int] = {}
    pending: dict[str, int] = {}
    for ev in events:
        scope = type_scope(ev)
        pending[scope] = max(pending.get(scope, ev.version), ev.version)
        if ev.change_type is ChangeType.TRUNCATE:
            out[scope] = max(out.get(scope, pending[scope]), pending[scope])
    return out


def truncate_suspects(events: Sequence[ChangeEvent], ceilings: Mapping[str, int | None]) -> set[str]:
    """The ids of ``events`` that may be copies of an event applied before a TRUNCATE of its type.

    Such a copy carries the original's version, which is at most the type's recorded ceiling (the
    highest version its key had when the truncate removed it, or a key an earlier truncate removed).
    An event above the ceiling cannot be one. A present row does not clear an event below it: the
    type may start again at any version after a truncate, so a re-created key can hold a lower
    version than the original had. A ceiling not known (None) makes every event of the type one.
    """
    out: set[str] = set()
    for ev in events:
        if ev.change_type is ChangeType.TRUNCATE:
            continue
        scope = type_scope(ev)
        if scope in ceilings:
            ceiling = ceilings[scope]
            if ceiling is None or ev.version <= ceiling:
                out.add(ev.event_id)
    return out


def raise_ceilings(ceilings: Mapping[str, int | None], tops: Mapping[str, int]) -> dict[str, int | None]:
    """``ceilings`` raised to ``tops`` per scope (an unknown ceiling becomes the top)."""
    out = dict(ceilings)
    for scope, top in tops.items():
        prev = out.get(scope)
        out[scope] = top if prev is None else max(prev, top)
    return out


def logged_ceilings(table: Table, scopes: set[str]) -> dict[str, int]:
    """The highest version the log holds per type scope (-1 when none): a truncate's ceiling.

    Read once per truncate commit (its type's log rows; every event applied before the truncate has
    one) and once per scope on a branch written before the ceilings were recorded."""
    from pyiceberg.expressions import In

    out = dict.fromkeys(scopes, -1)
    if table.current_snapshot() is None:
        return out
    wanted = In("entity_type", sorted({s.split("/", 1)[1] for s in scopes}))  # type: ignore[call-arg, arg-type]
    rows = table.scan(row_filter=wanted, selected_fields=("kind", "entity_type", "version")).to_arrow()
    for k, t, v in zip(*(rows.column(c).to_pylist() for c in ("kind", "entity_type", "version")), strict=True):
        scope = f"{k}/{t}"
        if scope in out:
            out[scope] = max(out[scope], v)
    return out


def logged_truncates(table: Table) -> set[str]:
    """The type scopes the log holds a TRUNCATE of: read once per branch written before
    ``TRUNCATED_PROPERTY`` (the commit that reads it records the property)."""
    from pyiceberg.expressions import EqualTo

    if table.current_snapshot() is None:
        return set()
    wanted = EqualTo("change_type", ChangeType.TRUNCATE.value)  # type: ignore[call-arg, arg-type]
    rows = table.scan(row_filter=wanted, selected_fields=("kind", "entity_type")).to_arrow()
    return {
        f"{k}/{t}" for k, t in zip(rows.column("kind").to_pylist(), rows.column("entity_type").to_pylist(), strict=True)
    }
