"""Three-way merge of two worlds at entity and property level (pure: Arrow tables in, decisions out).

Each side arrives as the table of the keys it **changed** since the merge base (``worlds.merge_read``
builds them from the data files that differ, see ``worlds.diff``): the key ``(kind, type, pk)``, the
entity's base state (``b_*`` columns) and its state on that side (``s_*`` for the source, ``t_*``
for the target). A state is ``live``, ``props`` (JSON text), ``from``/``to`` (link endpoints),
``version``, ``ts`` (``occurred_at`` of the row, epoch ms) and ``event`` (the event that wrote it).

The two tables are joined on the key (Arrow, full outer join). A key changed on one side only is
taken from that side without any per-row Python work; only keys changed on **both** sides are
decided one by one (:func:`decide`), then links are checked against deleted endpoints.

Rules (``S`` = source state, ``T`` = target state, ``B`` = base state; absent = deleted or never there):

====================  ==========================  =========================================
changed on            condition                   result
====================  ==========================  =========================================
source only           —                           take S
target only           —                           keep T
both                  S == T                      keep T (same change, no conflict)
both                  B absent, S != T            ADD_ADD
both                  S absent (deleted), T live  DELETE_MODIFY (source deleted, target modified)
both                  S live, T absent (deleted)  MODIFY_DELETE (source modified, target deleted)
both                  all live, S != T            MODIFY_MODIFY; FIELD_LEVEL merges property by
                                                  property and only the properties both sides
                                                  set to different values conflict
link live in result   an endpoint pk deleted by   ORPHAN_LINK
                      the other side (for a link
                      both sides changed, the
                      same or merged: either)
====================  ==========================  =========================================

The first word of a conflict type is the source's change, the second the target's, so merging B
into A reports the mirror types (MODIFY_DELETE ↔ DELETE_MODIFY) on the same keys.

Strategies resolve conflicts (see :class:`Strategy`): NORMAL leaves them (the merge aborts), TARGET
keeps the target's side, SOURCE takes the source's, TIMESTAMP takes the side whose state has the later
``occurred_at`` — on equal times the greater event id (byte order), and if those are equal too the
target keeps its state — and MANUAL leaves them to be resolved one by one. ``FIELD_LEVEL`` is a
modifier that merges property-wise first; combined as ``FIELD_LEVEL+SOURCE_WINS`` etc. the same
-property conflicts that remain are then resolved by the second strategy (plain ``FIELD_LEVEL`` =
``FIELD_LEVEL+NORMAL``). Per-type overrides pick the strategy by the entity's type (an orphan link by
the link's type). For ORPHAN_LINK, taking the link's side keeps the link and undoes the endpoint's
deletion (the endpoint returns to its base state); taking the deleting side keeps the deletion and
deletes the link. SCHEMA conflicts (:func:`schema_conflicts`) are never resolved automatically.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema

from worlds.errors import InvalidWorldRequest, WorldMoved, WorldNotFound, WorldsError

KEY = ("kind", "type", "pk")
STATE = ("live", "props", "from", "to", "version", "ts", "event")
STATE_TYPES = {
    "live": pa.bool_(),
    "props": pa.string(),
    "from": pa.string(),
    "to": pa.string(),
    "version": pa.int64(),
    "ts": pa.int64(),
    "event": pa.string(),
}
SOURCE, TARGET = "source", "target"


class MergeError(WorldsError):
    """A merge that cannot be done (bad strategy, conflicts under NORMAL, a moved target, ...)."""


class InvalidMerge(MergeError, InvalidWorldRequest):
    """A merge request that is wrong as asked (strategy, ``--take``, the same world on both sides)."""


class MergeNotFound(MergeError, WorldNotFound):
    """No pending merge into the world, or no such conflict in it."""


class MergeMoved(MergeError, WorldMoved):
    """The target moved since the merge was planned (or kept moving)."""


class ConflictType(StrEnum):
    MODIFY_MODIFY = "MODIFY_MODIFY"
    MODIFY_DELETE = "MODIFY_DELETE"  # source modified, target deleted
    DELETE_MODIFY = "DELETE_MODIFY"  # source deleted, target modified
    ADD_ADD = "ADD_ADD"
    SCHEMA = "SCHEMA"
    ORPHAN_LINK = "ORPHAN_LINK"

    def mirror(self) -> ConflictType:
        """The type the same conflict has when source and target swap."""
        swap = {
            ConflictType.MODIFY_DELETE: ConflictType.DELETE_MODIFY,
            ConflictType.DELETE_MODIFY: ConflictType.MODIFY_DELETE,
        }
        return swap.get(self, self)


class Resolve(StrEnum):
    NORMAL = "NORMAL"
    TARGET = "TARGET_WINS"
    SOURCE = "SOURCE_WINS"
    TIMESTAMP = "TIMESTAMP_WINS"
    MANUAL = "MANUAL"


_ALIASES = {
    "NORMAL": Resolve.NORMAL,
    "OURS": Resolve.TARGET,
    "TARGET_WINS": Resolve.TARGET,
    "THEIRS": Resolve.SOURCE,
    "SOURCE_WINS": Resolve.SOURCE,
    "TIMESTAMP_WINS": Resolve.TIMESTAMP,
    "MANUAL": Resolve.MANUAL,
}


@dataclass(frozen=True)
class Strategy:
    """How conflicts of a type are handled: property-wise first (``field_level``), then ``resolve``."""

    resolve: Resolve = Resolve.NORMAL
    field_level: bool = False

    @classmethod
    def parse(cls, text: str) -> Strategy:
        """``NORMAL``, ``OURS``/``TARGET_WINS``, ``THEIRS``/``SOURCE_WINS``, ``TIMESTAMP_WINS``, ``MANUAL``,
        ``FIELD_LEVEL`` or ``FIELD_LEVEL+<one of the others>`` (case-insensitive)."""
        parts = [p.strip().upper().replace("-", "_") for p in text.split("+") if p.strip()]
        field_level = "FIELD_LEVEL" in parts
        rest = [p for p in parts if p != "FIELD_LEVEL"]
        if not parts or len(rest) > 1 or (rest and rest[0] not in _ALIASES):
            names = ", ".join([*_ALIASES, "FIELD_LEVEL", "FIELD_LEVEL+<strategy>"])
            raise InvalidMerge(f"unknown merge strategy {text!r}; use one of {names}")
        return cls(_ALIASES[rest[0]] if rest else Resolve.NORMAL, field_level)

    def __str__(self) -> str:
        if self.field_level:
            return "FIELD_LEVEL" if self.resolve is Resolve.NORMAL else f"FIELD_LEVEL+{self.resolve.value}"
        return self.resolve.value


@dataclass(frozen=True)
class Strategies:
    """The default strategy and per-type overrides (``{entity_type: Strategy}``)."""

    default: Strategy = Strategy()
    per_type: Mapping[str, Strategy] = field(default_factory=dict)

    def for_type(self, entity_type: str) -> Strategy:
        return self.per_type.get(entity_type, self.default)

    @classmethod
    def parse(cls, default: str, overrides: Iterable[str] = ()) -> Strategies:
        """``default`` and ``TYPE=STRATEGY`` overrides, as the CLI takes them."""
        per: dict[str, Strategy] = {}
        for item in overrides:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise InvalidMerge(f"--strategy-for wants TYPE=STRATEGY, got {item!r}")
            per[name.strip()] = Strategy.parse(value)
        return cls(Strategy.parse(default), per)

    def to_json(self) -> dict[str, Any]:
        return {"default": str(self.default), "per_type": {k: str(v) for k, v in sorted(self.per_type.items())}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Strategies:
        return cls(Strategy.parse(doc["default"]), {k: Strategy.parse(v) for k, v in doc.get("per_type", {}).items()})


# --- one entity ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """An entity on one side. ``props is None`` means absent (deleted, or never there)."""

    props: dict[str, Any] | None
    from_pk: str | None = None
    to_pk: str | None = None
    version: int | None = None
    ts: int | None = None
    event: str | None = None

    @property
    def live(self) -> bool:
        return self.props is not None

    def content(self) -> tuple[Any, ...]:
        """What a change compares: presence, properties and endpoints (not version or time)."""
        if self.props is None:
            return (False,)
        return (True, orjson.dumps(self.props, option=orjson.OPT_SORT_KEYS), self.from_pk, self.to_pk)

    def same(self, other: State) -> bool:
        return self.content() == other.content()


ABSENT = State(None)


@dataclass(frozen=True)
class Conflict:
    kind: str
    entity_type: str
    pk: str
    type: ConflictType
    base: State
    source: State
    target: State
    fields: tuple[str, ...] = ()  # FIELD_LEVEL: the properties both sides set differently
    endpoints: tuple[str, ...] = ()  # ORPHAN_LINK: the deleted endpoint pks
    link_side: str | None = None  # ORPHAN_LINK: the side that changed the link

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.entity_type, self.pk)

    def to_json(self) -> dict[str, Any]:
        def st(s: State) -> dict[str, Any] | None:
            if not s.live:
                return None
            out: dict[str, Any] = {
                "properties": s.props,
                "version": s.version,
                "occurred_at_ms": s.ts,
                "event_id": s.event,
            }
            if self.kind == "link":
                out["from_pk"], out["to_pk"] = s.from_pk, s.to_pk
            return out

        doc: dict[str, Any] = {
            "kind": self.kind,
            "type": self.entity_type,
            "pk": self.pk,
            "conflict": self.type.value,
            "base": st(self.base),
            "source": st(self.source),
            "target": st(self.target),
        }
        if self.fields:
            doc["fields"] = list(self.fields)
        if self.endpoints:
            doc["endpoints"] = list(self.endpoints)
            doc["link_side"] = self.link_side
        return doc


@dataclass(frozen=True)
class Decision:
    """The result for one key: its state after the merge and where it came from."""

    result: State
    taken: str  # source | target | merged | same
    conflict: Conflict | None = None  # the conflict met (resolved unless ``open``)
    open: bool = False  # left unresolved (NORMAL or MANUAL)


def _winner(strategy: Resolve, source: State, target: State) -> str | None:
    """The side a resolving strategy picks, None when it leaves the conflict open."""
    if strategy is Resolve.SOURCE:
        return SOURCE
    if strategy is Resolve.TARGET:
        return TARGET
    if strategy is Resolve.TIMESTAMP:
        s = (source.ts if source.ts is not None else -1, source.event or "")
        t = (target.ts if target.ts is not None else -1, target.event or "")
        return SOURCE if s > t else TARGET
    return None


def decide(kind: str, etype: str, pk: str, base: State, source: State, target: State, strategy: Strategy) -> Decision:
    """The three-way decision for one key changed on both sides (also correct for one-sided changes)."""
    s_changed, t_changed = not source.same(base), not target.same(base)
    if not s_changed:
        return Decision(target, TARGET)
    if not t_changed:
        return Decision(source, SOURCE)
    if source.same(target):
        return Decision(target, "same")
    if not base.live:
        ctype = ConflictType.ADD_ADD
    elif not source.live:
        ctype = ConflictType.DELETE_MODIFY
    elif not target.live:
        ctype = ConflictType.MODIFY_DELETE
    else:
        ctype = ConflictType.MODIFY_MODIFY
    fields: tuple[str, ...] = ()
    merged: State | None = None
    if ctype is ConflictType.MODIFY_MODIFY and strategy.field_level:
        merged, fields = _field_merge(base, source, target)
        if not fields:
            return Decision(merged, "merged")
    conflict = Conflict(kind, etype, pk, ctype, base, source, target, fields)
    side = _winner(strategy.resolve, source, target)
    if side is None:
        return Decision(target, TARGET, conflict, open=True)
    if merged is not None:  # field-level: only the conflicting properties follow the winner
        return Decision(_field_take(merged, source if side == SOURCE else target, fields), "merged", conflict)
    return Decision(source if side == SOURCE else target, side, conflict)


_MISSING = object()


def _field_merge(base: State, source: State, target: State) -> tuple[State, tuple[str, ...]]:
    """Property-wise three-way merge (endpoints count as properties ``from_pk``/``to_pk``)."""
    b, s, t = _fields(base), _fields(source), _fields(target)
    out: dict[str, Any] = {}
    conflicts: list[str] = []
    for name in sorted(set(b) | set(s) | set(t)):
        bv, sv, tv = b.get(name, _MISSING), s.get(name, _MISSING), t.get(name, _MISSING)
        if _eq(sv, bv):
            v = tv
        elif _eq(tv, bv) or _eq(sv, tv):
            v = sv
        else:
            conflicts.append(name)
            v = tv
        if v is not _MISSING:
            out[name] = v
    return _unfields(out, source, target), tuple(conflicts)


def _field_take(merged: State, winner: State, names: tuple[str, ...]) -> State:
    out = _fields(merged)
    w = _fields(winner)
    for name in names:
        if name in w:
            out[name] = w[name]
        else:
            out.pop(name, None)
    return _unfields(out, winner, merged)


def _fields(s: State) -> dict[str, Any]:
    out = {f"p:{k}": v for k, v in (s.props or {}).items()}
    out["from_pk"], out["to_pk"] = s.from_pk, s.to_pk
    return out


def _unfields(values: dict[str, Any], newer: State, other: State) -> State:
    props = {k[2:]: v for k, v in values.items() if k.startswith("p:")}
    ts = max((x for x in (newer.ts, other.ts) if x is not None), default=None)
    return State(props, values.get("from_pk"), values.get("to_pk"), newer.version, ts, newer.event)


def _eq(a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return a is b
    return orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS)


# --- tables of changed keys ------------------------------------------------------------------------


def changes_schema(prefix: str) -> pa.Schema:
    """The schema of one side's changed keys: key, ``b_*`` base state, ``<prefix>*`` side state."""
    cols = [pa.field(k, pa.string()) for k in KEY]
    cols += [pa.field("b_" + c, STATE_TYPES[c]) for c in STATE]
    cols += [pa.field(prefix + c, STATE_TYPES[c]) for c in STATE]
    return pa.schema(cols)


def changes_table(rows: Iterable[tuple[tuple[str, str, str], State, State]], prefix: str) -> pa.Table:
    """Build a side's change table from ``(key, base, side)`` (tests and small inputs)."""
    data: dict[str, list[Any]] = {n: [] for n in changes_schema(prefix).names}
    for key, base, side in rows:
        for k, v in zip(KEY, key, strict=True):
            data[k].append(v)
        for p, st in (("b_", base), (prefix, side)):
            data[p + "live"].append(st.live)
            data[p + "props"].append(orjson.dumps(st.props, option=orjson.OPT_SORT_KEYS).decode() if st.live else None)
            data[p + "from"].append(st.from_pk)
            data[p + "to"].append(st.to_pk)
            data[p + "version"].append(st.version)
            data[p + "ts"].append(st.ts)
            data[p + "event"].append(st.event)
    return pa.table(data, schema=changes_schema(prefix))


def _state(row: Mapping[str, Any], p: str) -> State:
    live = bool(row.get(p + "live"))
    props = orjson.loads(row[p + "props"]) if live and row.get(p + "props") else ({} if live else None)
    return State(
        props, row.get(p + "from"), row.get(p + "to"), row.get(p + "version"), row.get(p + "ts"), row.get(p + "event")
    )


# --- the merge --------------------------------------------------------------------------------------


@dataclass
class MergeResult:
    """What a merge does to the target.

    ``writes`` holds one row per key whose target state changes: the key, the new state (``r_*``),
    the target's current version (``t_version``) and base/source versions (for a monotonic new
    version) and ``cause`` (the source event that caused it, or None). ``conflicts`` are the open
    ones (the merge must not commit while any is open), ``resolved`` those a strategy settled.
    """

    writes: pa.Table
    conflicts: list[Conflict] = field(default_factory=list)
    resolved: list[Conflict] = field(default_factory=list)
    taken: dict[str, int] = field(default_factory=dict)  # source | target | merged | same → keys

    @property
    def conflict_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.conflicts:
            out[c.type.value] = out.get(c.type.value, 0) + 1
        return dict(sorted(out.items()))

    @property
    def resolved_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.resolved:
            out[c.type.value] = out.get(c.type.value, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> dict[str, Any]:
        return {
            "writes": self.writes.num_rows,
            "taken": dict(sorted(self.taken.items())),
            "conflicts": self.conflict_counts,
            "resolved": self.resolved_counts,
        }


WRITES_SCHEMA = pa.schema(
    [pa.field(k, pa.string()) for k in KEY]
    + [pa.field("r_" + c, STATE_TYPES[c]) for c in STATE]
    + [
        pa.field("b_version", pa.int64()),
        pa.field("s_version", pa.int64()),
        pa.field("t_version", pa.int64()),
        pa.field("t_live", pa.bool_()),
        pa.field("cause", pa.string()),
        pa.field("taken", pa.string()),
    ]
)


def _empty(prefix: str) -> pa.Table:
    return changes_schema(prefix).empty_table()


Key = tuple[str, str, str]
Orphan = tuple[Key, tuple[str, ...], str, tuple[Key, ...]]


@dataclass
class _Row:
    """A key that needs a Python decision, with its three states."""

    base: State
    source: State
    target: State
    in_s: bool
    in_t: bool


def merge(
    source: pa.Table | None,
    target: pa.Table | None,
    strategies: Strategies,
    resolutions: Mapping[tuple[Key, str], State | str] | None = None,
) -> MergeResult:
    """Merge the source's changed keys into the target's (both relative to the same base).

    ``resolutions`` (MANUAL) settle open conflicts by ``(key, conflict type)``: ``"source"``,
    ``"target"`` or an explicit :class:`State` for the key (for ORPHAN_LINK: the link's state).
    """
    source = _empty("s_") if source is None else source
    target = _empty("t_") if target is None else target
    s = source.append_column("_s", pa.array([True] * source.num_rows, pa.bool_()))
    t = target.rename_columns([c if not c.startswith("b_") else "tb_" + c[2:] for c in target.column_names])
    t = t.append_column("_t", pa.array([True] * target.num_rows, pa.bool_()))
    joined = s.join(t, list(KEY), join_type="full outer")
    in_s = pc.fill_null(joined.column("_s"), False)
    in_t = pc.fill_null(joined.column("_t"), False)
    result = MergeResult(writes=WRITES_SCHEMA.empty_table())
    rows: dict[Key, _Row] = {}
    resolutions = resolutions or {}

    # Keys changed on both sides: one decision each (only these rows reach Python here).
    decided: dict[Key, Decision] = {}
    for r in joined.filter(pc.and_(in_s, in_t)).to_pylist():
        rows[_key(r)] = row = _Row(_state(r, "b_"), _state(r, "s_"), _state(r, "t_"), True, True)
        d = decide(*_key(r), row.base, row.source, row.target, strategies.for_type(r["type"]))
        if d.open and d.conflict is not None and (d.conflict.key, d.conflict.type.value) in resolutions:
            d = _resolved(d.conflict, resolutions[(d.conflict.key, d.conflict.type.value)])
        decided[_key(r)] = d

    # Orphan links: a link (possibly) live in the result, changed by one side, whose endpoint the
    # other side deleted. The link's own decision comes first; the orphan check then keeps it (and
    # restores the endpoints) or deletes it.
    settle: dict[Key, State] = {}
    orphan_conflicts: list[tuple[Conflict, bool]] = []
    # A link both sides hold can be orphaned from both sides (each deleted another endpoint): it
    # is kept only if every one of its orphan conflicts keeps it, and only then are endpoints restored.
    dropped: set[Key] = set()
    restore: dict[Key, dict[Key, State]] = {}
    for link_key, endpoints, link_side, obj_keys in _find_orphans(joined, in_s, in_t, decided, rows):
        link = rows[link_key]
        conflict = Conflict(
            *link_key, ConflictType.ORPHAN_LINK, link.base, link.source, link.target, (), endpoints, link_side
        )
        own = decided.get(link_key)
        if own is not None and own.open:
            orphan_conflicts.append((conflict, True))  # decided after the link's own conflict
            continue
        # The link's own decision (one side's state, or merged property-wise) is what is kept.
        link_state = own.result if own is not None else link.source if link_side == SOURCE else link.target
        how = resolutions.get((link_key, ConflictType.ORPHAN_LINK.value))
        if how is None:
            resolve = strategies.for_type(link_key[1]).resolve
            deleted = rows[obj_keys[0]].target if link_side == SOURCE else rows[obj_keys[0]].source
            if resolve is Resolve.TIMESTAMP:
                pair = (link_state, deleted) if link_side == SOURCE else (deleted, link_state)
                how = _winner(resolve, *pair)
            else:
                how = _winner(resolve, link.source, link.target)
        if how is None:
            orphan_conflicts.append((conflict, True))
            settle[link_key] = link.target if link.in_t else link.base
            continue
        orphan_conflicts.append((conflict, False))
        keep = how == link_side if isinstance(how, str) else how.live
        if keep:
            settle[link_key] = how if isinstance(how, State) else link_state
            for obj_key in obj_keys:  # undo the endpoints' deletion: they keep the link side's state
                obj = rows[obj_key]
                restore.setdefault(link_key, {})[obj_key] = obj.source if link_side == SOURCE else obj.target
        else:
            dropped.add(link_key)
    for link_key in dropped:
        settle[link_key] = ABSENT
    for link_key, objs in restore.items():
        if link_key not in dropped:
            settle.update(objs)

    for _, d in sorted(decided.items()):
        if d.conflict is not None:
            (result.conflicts if d.open else result.resolved).append(d.conflict)
    for c, is_open in sorted(orphan_conflicts, key=lambda x: x[0].key):
        (result.conflicts if is_open else result.resolved).append(c)

    # Writes: source-only keys (vectorized), minus keys a Python decision took over, plus decisions.
    only_s = joined.filter(pc.and_(in_s, pc.invert(in_t)))
    python_keys = set(decided) | set(settle)
    vec = _writes_from(only_s, python_keys)
    extra: list[dict[str, Any]] = []
    counts = {SOURCE: vec.num_rows, TARGET: 0, "merged": 0, "same": 0}
    for key in sorted(python_keys):
        row = rows[key]
        found = decided.get(key)
        if key not in settle and found is not None and found.open:
            continue
        state = settle[key] if key in settle else found.result  # type: ignore[union-attr]
        current = row.target if row.in_t else row.base
        if state.same(current):
            counts["same" if found is not None and found.taken == "same" else TARGET] += 1
            continue
        taken = SOURCE if state.same(row.source) and row.in_s else "merged"
        counts[taken] += 1
        extra.append(_write_row(key, state, row, taken))
    counts[TARGET] += int(pc.sum(pc.and_(in_t, pc.invert(in_s))).as_py() or 0) - sum(
        1 for k in python_keys if rows[k].in_t and not rows[k].in_s
    )
    result.taken = counts
    parts = [vec]
    if extra:
        parts.append(pa.Table.from_pylist(extra, schema=WRITES_SCHEMA))
    result.writes = pa.concat_tables(parts).sort_by([(k, "ascending") for k in KEY])
    return result


def _resolved(c: Conflict, how: State | str) -> Decision:
    if isinstance(how, State):
        return Decision(how, "merged", c)
    return Decision(c.source if how == SOURCE else c.target, how, c)


def _key(r: Mapping[str, Any]) -> Key:
    return (r["kind"], r["type"], r["pk"])


def _row_of(r: Mapping[str, Any], in_s: bool, in_t: bool) -> _Row:
    base = _state(r, "b_") if in_s else _state(r, "tb_")
    return _Row(base, _state(r, "s_") if in_s else base, _state(r, "t_") if in_t else base, in_s, in_t)


_DELETES = {ConflictType.MODIFY_DELETE: TARGET, ConflictType.DELETE_MODIFY: SOURCE}


def _find_orphans(
    joined: pa.Table, in_s: pa.Array, in_t: pa.Array, decided: Mapping[Key, Decision], rows: dict[Key, _Row]
) -> list[Orphan]:
    """``(link key, endpoint pks, link side, object keys)`` for every orphaned link (vectorized search)."""
    kind = joined.column("kind")
    base_live = pc.fill_null(pc.coalesce(joined.column("b_live"), joined.column("tb_live")), False)
    objects = pc.equal(kind, "object")
    only_s, only_t = pc.and_(in_s, pc.invert(in_t)), pc.and_(in_t, pc.invert(in_s))
    gone_s = pc.invert(pc.fill_null(joined.column("s_live"), True))
    gone_t = pc.invert(pc.fill_null(joined.column("t_live"), True))
    deleted: dict[str, dict[str, list[Key]]] = {SOURCE: {}, TARGET: {}}
    for side, mask in (
        (SOURCE, pc.and_(pc.and_(objects, only_s), pc.and_(base_live, gone_s))),
        (TARGET, pc.and_(pc.and_(objects, only_t), pc.and_(base_live, gone_t))),
    ):
        for r in joined.filter(mask).select(list(KEY)).to_pylist():
            deleted[side].setdefault(r["pk"], []).append(_key(r))
    for key, d in decided.items():
        if key[0] != "object" or not rows[key].base.live:
            continue
        if d.open and d.conflict is not None and d.conflict.type in _DELETES:
            # An open conflict may still end in the deletion: its links are flagged too, so a
            # resolution one by one meets them (and A into B, B into A see the same set).
            deleted[_DELETES[d.conflict.type]].setdefault(key[2], []).append(key)
        elif not d.open and not d.result.live and d.taken in (SOURCE, TARGET):
            deleted[d.taken].setdefault(key[2], []).append(key)
    if not deleted[SOURCE] and not deleted[TARGET]:
        return []
    links = pc.equal(kind, "link")
    found: list[Orphan] = []
    for link_side, mask, other in ((SOURCE, pc.and_(links, only_s), TARGET), (TARGET, pc.and_(links, only_t), SOURCE)):
        gone = pa.array(sorted(deleted[other]), pa.string())
        if not len(gone):
            continue
        p = "s_" if link_side == SOURCE else "t_"
        live = pc.fill_null(joined.column(p + "live"), False)
        hit = pc.or_(
            pc.is_in(joined.column(p + "from"), value_set=gone), pc.is_in(joined.column(p + "to"), value_set=gone)
        )
        for r in joined.filter(pc.and_(mask, pc.and_(live, pc.fill_null(hit, False)))).to_pylist():
            row = _row_of(r, link_side == SOURCE, link_side == TARGET)
            rows[_key(r)] = row
            state = row.source if link_side == SOURCE else row.target
            found.append(_orphan(_key(r), state, link_side, deleted[other]))
    for key, d in decided.items():
        if key[0] != "link":
            continue
        row = rows[key]
        if d.open:  # either side's link state may be the result: the first orphaned one is flagged
            for side in (SOURCE, TARGET):
                st = row.source if side == SOURCE else row.target
                other = TARGET if side == SOURCE else SOURCE
                if st.live and (st.from_pk in deleted[other] or st.to_pk in deleted[other]):
                    found.append(_orphan(key, st, side, deleted[other]))
                    break
            continue
        # A link taken from one side is orphaned by the other's deletions; a link both sides hold
        # (the same change, or merged property-wise) by either side's: the side that deleted an
        # endpoint still links to it in the result, so the other side is the link's side.
        sides = (d.taken,) if d.taken in (SOURCE, TARGET) else (SOURCE, TARGET)
        for side in sides:
            other = TARGET if side == SOURCE else SOURCE
            st = d.result
            if st.live and (st.from_pk in deleted[other] or st.to_pk in deleted[other]):
                found.append(_orphan(key, st, side, deleted[other]))
    need = {obj for *_, objs in found for obj in objs if obj not in rows}
    if need:
        pks = pa.array(sorted({k[2] for k in need}), pa.string())
        for r in joined.filter(pc.and_(objects, pc.is_in(joined.column("pk"), value_set=pks))).to_pylist():
            if _key(r) in need:
                rows[_key(r)] = _row_of(r, r.get("_s") is True, r.get("_t") is True)
    return sorted(set(found))


def _orphan(key: Key, state: State, side: str, deleted: Mapping[str, list[Key]]) -> Orphan:
    ends = tuple(sorted({e for e in (state.from_pk, state.to_pk) if e is not None and e in deleted}))
    return (key, ends, side, tuple(sorted(k for e in ends for k in deleted[e])))


def _writes_from(only_s: pa.Table, drop: set[Key]) -> pa.Table:
    """Write rows for keys changed on the source only: the source state, vectorized."""
    if only_s.num_rows == 0:
        return WRITES_SCHEMA.empty_table()
    n = only_s.num_rows
    data = {k: only_s.column(k) for k in KEY}
    for c in STATE:
        data["r_" + c] = only_s.column("s_" + c)
    data["b_version"] = only_s.column("b_version")
    data["s_version"] = only_s.column("s_version")
    data["t_version"] = only_s.column("b_version")  # the target still has the base state
    data["t_live"] = only_s.column("b_live")
    data["cause"] = only_s.column("s_event")
    data["taken"] = pa.array([SOURCE] * n, pa.string())
    out = pa.table(data, schema=WRITES_SCHEMA)
    if drop:
        mask = pc.is_in(_joined_key(out), value_set=pa.array(sorted("\x1f".join(k) for k in drop), pa.string()))
        out = out.filter(pc.invert(mask))
    return out


def _joined_key(t: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(t.column("kind"), t.column("type"), t.column("pk"), "\x1f")


def _write_row(key: Key, state: State, row: _Row, taken: str) -> dict[str, Any]:
    current = row.target if row.in_t else row.base
    cause = state.event if state.event is not None and state.event == row.source.event else row.source.event
    return {
        "kind": key[0],
        "type": key[1],
        "pk": key[2],
        "r_live": state.live,
        "r_props": orjson.dumps(state.props, option=orjson.OPT_SORT_KEYS).decode() if state.live else None,
        "r_from": state.from_pk,
        "r_to": state.to_pk,
        "r_version": state.version,
        "r_ts": state.ts,
        "r_event": state.event,
        "b_version": row.base.version,
        "s_version": row.source.version,
        "t_version": current.version,
        "t_live": current.live,
        "cause": cause,
        "taken": taken,
    }


# --- applying (the truth the tests compare with) ------------------------------------------------------


def apply_writes(state: Mapping[Key, State], writes: pa.Table) -> dict[Key, State]:
    """``state`` (the target's live entities) with ``writes`` applied: what the merge commits."""
    out = dict(state)
    for r in writes.to_pylist():
        key = _key(r)
        st = _state(r, "r_")
        if st.live:
            out[key] = st
        else:
            out.pop(key, None)
    return out


# --- schema ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemaConflict:
    table: str
    column: str
    detail: str


def schema_conflicts(
    table: str, base: Schema | None, source: Schema | None, target: Schema | None
) -> list[SchemaConflict]:
    """Columns both sides changed incompatibly: the same new name with different types, or the same
    field renamed to different names, or the same field promoted to different types."""
    fb = {f.field_id: f for f in (base.fields if base else ())}
    fs = {f.field_id: f for f in (source.fields if source else ())}
    ft = {f.field_id: f for f in (target.fields if target else ())}
    out: list[SchemaConflict] = []
    new_s = {f.name: f for fid, f in fs.items() if fid not in fb}
    new_t = {f.name: f for fid, f in ft.items() if fid not in fb}
    for name in sorted(set(new_s) & set(new_t)):
        if str(new_s[name].field_type) != str(new_t[name].field_type):
            out.append(
                SchemaConflict(
                    table,
                    name,
                    f"added as {new_s[name].field_type} on the source, {new_t[name].field_type} on the target",
                )
            )
    for fid in sorted(set(fb) & set(fs) & set(ft)):
        b, x, y = fb[fid], fs[fid], ft[fid]
        if x.name != b.name and y.name != b.name and x.name != y.name:
            out.append(SchemaConflict(table, b.name, f"renamed to {x.name} on the source, {y.name} on the target"))
        if (
            str(x.field_type) != str(b.field_type)
            and str(y.field_type) != str(b.field_type)
            and str(x.field_type) != str(y.field_type)
        ):
            out.append(
                SchemaConflict(table, b.name, f"changed to {x.field_type} on the source, {y.field_type} on the target")
            )
    return out
