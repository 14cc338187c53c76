"""The schema contract: object and link types, their typed properties, and how they may change.

Pure: no I/O, no clock. The control plane owns the schema; it publishes one ``schema.updated``
event per change of one type in one world (or ``"*"``: every world). The data layer (schema sync)
applies it as Iceberg schema evolution and answers with ``storage.schema.updated``.

Wire format of ``schema.updated`` (JSON object; Kafka key ``"<world_id>::<kind>:<type>"``)::

    change_id    str, required, unique: the idempotency key of the change (1..200 chars)
    world_id     a world id, or "*" for every world branch that exists when it is applied
    kind         "object" | "link"
    type_name    the object or link type (a NAME, see below)
    version      int >= 1: the type's schema version *after* this change (previous + 1)
    occurred_at  ISO-8601 or epoch ms: when the control plane committed the change
    changes      non-empty list, applied in order, each one of:
                   {"op": "add",       "id": PID, "name": NAME, "type": TYPE}
                   {"op": "rename",    "id": PID, "name": NAME}
                   {"op": "widen",     "id": PID, "type": TYPE}
                   {"op": "deprecate", "id": PID}

    PID   a stable property id, never reused: [A-Za-z0-9][A-Za-z0-9_.:-]{0,63}
    NAME  [A-Za-z][A-Za-z0-9_]{0,62}, no "__", not ending in "_"
    TYPE  string | int | long | float | double | boolean | decimal(P,S) | date | timestamp | timestamptz

Versions are per ``(world, kind, type)`` and consecutive: one more than the applied version is
applied, anything higher waits for the gap to fill. ``change_id`` is the idempotency key: a
change at or below the applied version is a duplicate (a no-op) if that version was applied by
the same ``change_id``, and refused as ``version-conflict`` if another change holds it.
Compatible changes only: widening is int→long, float→double and decimal(P,S)→decimal(P',S) with
P' > P; anything else (narrowing, a type change, adding or renaming onto a name that is or was
another property's, touching an unknown id) is *refused* with a stable reason code.

A property ``name`` of type ``T`` is stored in the typed column ``p_<t>__<name>`` (lower-cased,
see :func:`column_name`) of ``entity_common`` (objects) or ``entity_edge`` (links); the column is
bound to the property by Iceberg field id, so a rename is a metadata-only column rename.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson

from models.errors import SchemaError
from models.events import EntityKind, Invalid
from models.worlds import InvalidWorldId, validate_world_id

ALL_WORLDS = "*"
MAX_ID_LEN = 200
MAX_PRECISION = 38

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")
_PID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_DECIMAL = re.compile(r"decimal\(\s*(\d{1,2})\s*,\s*(\d{1,2})\s*\)")


class SchemaRefused(SchemaError, ValueError):
    """A change the data layer will not apply; ``reason`` is a stable code for labels and headers."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class Primitive(StrEnum):
    STRING = "string"
    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    BOOLEAN = "boolean"
    DECIMAL = "decimal"
    DATE = "date"
    TIMESTAMP = "timestamp"  # without time zone (Iceberg timestamp): a wall-clock value
    TIMESTAMPTZ = "timestamptz"  # with time zone (Iceberg timestamptz): an instant, stored as UTC


@dataclass(frozen=True, slots=True)
class PropType:
    """A property type; ``precision``/``scale`` only for decimals."""

    primitive: Primitive
    precision: int = 0
    scale: int = 0

    @classmethod
    def parse(cls, text: object) -> PropType:
        if not isinstance(text, str):
            raise SchemaRefused("bad-type", f"a property type must be a string, got {type(text).__name__}")
        t = text.strip().lower()
        m = _DECIMAL.fullmatch(t)
        if m:
            p, s = int(m.group(1)), int(m.group(2))
            if not 1 <= p <= MAX_PRECISION or s > p:
                raise SchemaRefused("bad-type", f"{text!r}: need 1 <= precision <= {MAX_PRECISION}, scale <= precision")
            return cls(Primitive.DECIMAL, p, s)
        try:
            prim = Primitive(t)
        except ValueError:
            raise SchemaRefused(
                "bad-type", f"unknown property type {text[:40]!r}; use {', '.join(Primitive)} (decimal as decimal(P,S))"
            ) from None
        if prim is Primitive.DECIMAL:
            raise SchemaRefused("bad-type", "decimal needs a precision and a scale: decimal(P,S)")
        return cls(prim)

    def __str__(self) -> str:
        if self.primitive is Primitive.DECIMAL:
            return f"decimal({self.precision},{self.scale})"
        return self.primitive.value


_WIDENINGS = {(Primitive.INT, Primitive.LONG), (Primitive.FLOAT, Primitive.DOUBLE)}


def check_widening(old: PropType, new: PropType) -> None:
    """Raise SchemaRefused unless ``old`` → ``new`` is a widening Iceberg applies in metadata only."""
    if old == new:
        raise SchemaRefused("not-a-widening", f"the property already has type {old}")
    if (old.primitive, new.primitive) in _WIDENINGS:
        return
    if old.primitive is Primitive.DECIMAL and new.primitive is Primitive.DECIMAL:
        if new.scale != old.scale:
            raise SchemaRefused("incompatible-type", f"{old} → {new}: a decimal's scale cannot change")
        if new.precision < old.precision:
            raise SchemaRefused("narrowing", f"{old} → {new} narrows the precision")
        return
    narrowing = {(b, a) for a, b in _WIDENINGS}
    if (old.primitive, new.primitive) in narrowing:
        raise SchemaRefused("narrowing", f"{old} → {new} narrows the type; only int→long, float→double widen")
    raise SchemaRefused("incompatible-type", f"{old} → {new} is not a widening (int→long, float→double, decimal P↑)")


def check_name(name: object, what: str = "name") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or "__" in name or name.endswith("_"):
        raise SchemaRefused(
            "bad-name",
            f"{what} {str(name)[:80]!r}: use a letter then letters, digits or '_' (max 63), no '__', no trailing '_'",
        )
    return name


def column_name(type_name: str, prop_name: str) -> str:
    """The typed column of a property: ``p_<type>__<name>``, lower-cased.

    Names contain no ``__`` and do not end in ``_`` (see :func:`check_name`), so the separator
    makes the column unique per (type, name) within a table.
    """
    return f"p_{type_name.lower()}__{prop_name.lower()}"


@dataclass(frozen=True, slots=True)
class Property:
    """One property of a type: its stable id, current name and type, and the names it had before."""

    id: str
    name: str
    type: PropType
    deprecated: bool = False
    aliases: tuple[str, ...] = ()  # earlier names, newest first: old events still carry them

    def column(self, type_name: str) -> str:
        return column_name(type_name, self.name)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "type": str(self.type),
            "deprecated": self.deprecated,
            "aliases": list(self.aliases),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Property:
        return cls(
            d["id"], d["name"], PropType.parse(d["type"]), bool(d.get("deprecated")), tuple(d.get("aliases") or ())
        )


@dataclass(frozen=True, slots=True)
class TypeSchema:
    """What the data layer holds of one type: version and properties (in the order they were added)."""

    kind: EntityKind
    type_name: str
    version: int = 0
    properties: tuple[Property, ...] = ()
    # The change_id that brought the type to each version (index = version - 1); empty for
    # contracts written before change ids were recorded (then a version is all we can compare).
    change_ids: tuple[str, ...] = ()

    def applied_by(self, version: int) -> str | None:
        """The change_id that produced ``version``, if recorded ("" marks a version from before ids were kept)."""
        if 1 <= version <= len(self.change_ids):
            return self.change_ids[version - 1] or None
        return None

    def by_id(self, pid: str) -> Property | None:
        return next((p for p in self.properties if p.id == pid), None)

    def by_name(self, name: str) -> Property | None:
        low = name.lower()
        return next((p for p in self.properties if p.name.lower() == low), None)

    def to_json(self) -> str:
        doc = {
            "kind": self.kind.value,
            "type_name": self.type_name,
            "version": self.version,
            "properties": [p.to_json() for p in self.properties],
            "change_ids": list(self.change_ids),
        }
        return orjson.dumps(doc).decode()

    @classmethod
    def from_json(cls, text: str) -> TypeSchema:
        d = orjson.loads(text)
        props = tuple(Property.from_json(p) for p in d.get("properties", ()))
        ids = tuple(str(c) for c in d.get("change_ids") or ())
        return cls(EntityKind(d["kind"]), d["type_name"], int(d["version"]), props, ids)


# --- changes --------------------------------------------------------------------------------------


class Op(StrEnum):
    ADD = "add"
    RENAME = "rename"
    WIDEN = "widen"
    DEPRECATE = "deprecate"


@dataclass(frozen=True, slots=True)
class PropertyChange:
    op: Op
    id: str
    name: str | None = None
    type: PropType | None = None


@dataclass(frozen=True, slots=True)
class SchemaChange:
    """One ``schema.updated`` event: a change of one type's schema, to ``version``."""

    change_id: str
    world_id: str  # a world id or ALL_WORLDS
    kind: EntityKind
    type_name: str
    version: int
    occurred_at_ms: int
    changes: tuple[PropertyChange, ...]

    @property
    def key(self) -> str:
        return f"{self.world_id}::{self.kind.value}:{self.type_name}"

    def to_wire(self) -> dict[str, Any]:
        ops: list[dict[str, Any]] = []
        for c in self.changes:
            d: dict[str, Any] = {"op": c.op.value, "id": c.id}
            if c.name is not None:
                d["name"] = c.name
            if c.type is not None:
                d["type"] = str(c.type)
            ops.append(d)
        return {
            "change_id": self.change_id,
            "world_id": self.world_id,
            "kind": self.kind.value,
            "type_name": self.type_name,
            "version": self.version,
            "occurred_at": self.occurred_at_ms,
            "changes": ops,
        }

    def encode(self) -> bytes:
        return orjson.dumps(self.to_wire())

    def for_world(self, world_id: str) -> SchemaChange:
        return replace(self, world_id=world_id)


# Column operations the storage layer carries out (Iceberg schema evolution), in order.
@dataclass(frozen=True, slots=True)
class AddColumn:
    column: str
    type: PropType
    doc: str
    property: Property


@dataclass(frozen=True, slots=True)
class RenameColumn:
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class WidenColumn:
    column: str
    type: PropType


@dataclass(frozen=True, slots=True)
class DocColumn:
    column: str
    doc: str


ColumnOp = AddColumn | RenameColumn | WidenColumn | DocColumn


class Verdict(StrEnum):
    APPLY = "applied"
    DUPLICATE = "duplicate"
    WAIT = "waiting"


@dataclass(frozen=True)
class Decision:
    """What to do with a change given the applied schema: apply (with the new schema), skip or wait."""

    verdict: Verdict
    schema: TypeSchema
    ops: tuple[ColumnOp, ...] = ()


def column_doc(prop: Property) -> str:
    doc = f"property {prop.id} ({prop.type})"
    return doc + " DEPRECATED" if prop.deprecated else doc


def decide(current: TypeSchema | None, change: SchemaChange) -> Decision:
    """Apply ``change`` to ``current`` (None: the type is new), or say why not; raises SchemaRefused.

    Versions: ``current + 1`` applies, higher waits for the gap; ``<= current`` is a duplicate when
    the same ``change_id`` produced that version, else a ``version-conflict`` refusal.
    """
    cur = current or TypeSchema(change.kind, change.type_name)
    if change.version <= cur.version:
        holder = cur.applied_by(change.version)
        if holder is not None and holder != change.change_id:
            raise SchemaRefused(
                "version-conflict",
                f"{change.kind.value} type {change.type_name} version {change.version} was applied by change "
                f"{holder!r}, not {change.change_id[:80]!r}; send this change with version {cur.version + 1}",
            )
        return Decision(Verdict.DUPLICATE, cur)
    if change.change_id in cur.change_ids:
        raise SchemaRefused(
            "version-conflict",
            f"change {change.change_id[:80]!r} was applied as version {cur.change_ids.index(change.change_id) + 1}"
            f" of {change.type_name}; a change id cannot name another version ({change.version})",
        )
    if change.version > cur.version + 1:
        return Decision(Verdict.WAIT, cur)
    props = list(cur.properties)
    ops: list[ColumnOp] = []
    t = change.type_name

    def index(pid: str) -> int:
        for i, p in enumerate(props):
            if p.id == pid:
                return i
        raise SchemaRefused("unknown-property", f"{change.kind.value} type {t} has no property with id {pid!r}")

    def name_taken(name: str, except_id: str | None = None) -> None:
        # A former name stays reserved: events from producers on an older schema still carry it,
        # and the committer fills a property's column from its earlier names too.
        low = name.lower()
        for p in props:
            if p.id == except_id:
                continue
            if p.name.lower() == low:
                raise SchemaRefused("duplicate-name", f"{t} already has a property named {p.name!r} (id {p.id})")
            if any(a.lower() == low for a in p.aliases):
                raise SchemaRefused(
                    "former-name",
                    f"{name!r} was the name of {t} property {p.id} (now {p.name!r}); old events still carry it",
                )

    for c in change.changes:
        if c.op is Op.ADD:
            assert c.name is not None and c.type is not None
            if any(p.id == c.id for p in props):
                raise SchemaRefused("duplicate-id", f"{t} already has a property with id {c.id!r}")
            name_taken(c.name)
            prop = Property(c.id, c.name, c.type)
            props.append(prop)
            ops.append(AddColumn(prop.column(t), c.type, column_doc(prop), prop))
        elif c.op is Op.RENAME:
            assert c.name is not None
            i = index(c.id)
            old = props[i]
            if old.name == c.name:
                raise SchemaRefused("not-a-rename", f"property {c.id!r} is already named {c.name!r}")
            name_taken(c.name, except_id=c.id)
            aliases = (old.name,) + tuple(a for a in old.aliases if a.lower() != c.name.lower())
            props[i] = replace(old, name=c.name, aliases=aliases)
            if old.column(t) != props[i].column(t):
                ops.append(RenameColumn(old.column(t), props[i].column(t)))
        elif c.op is Op.WIDEN:
            assert c.type is not None
            i = index(c.id)
            check_widening(props[i].type, c.type)
            props[i] = replace(props[i], type=c.type)
            ops.append(WidenColumn(props[i].column(t), c.type))
            ops.append(DocColumn(props[i].column(t), column_doc(props[i])))
        elif c.op is Op.DEPRECATE:
            i = index(c.id)
            if props[i].deprecated:
                raise SchemaRefused("already-deprecated", f"property {c.id!r} is already deprecated")
            props[i] = replace(props[i], deprecated=True)
            ops.append(DocColumn(props[i].column(t), column_doc(props[i])))
    ids = cur.change_ids if len(cur.change_ids) == cur.version else ("",) * cur.version
    schema = replace(cur, version=change.version, properties=tuple(props), change_ids=(*ids, change.change_id))
    return Decision(Verdict.APPLY, schema, tuple(ops))


# --- decoding -------------------------------------------------------------------------------------


def _str(doc: dict[str, Any], name: str) -> str:
    v = doc.get(name)
    if not isinstance(v, str) or not v.strip():
        raise SchemaRefused("missing-field", f"'{name}' is required (a non-empty string)")
    if len(v) > MAX_ID_LEN:
        raise SchemaRefused("field-too-long", f"'{name}' has {len(v)} characters; at most {MAX_ID_LEN}")
    return v


def _timestamp_ms(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise SchemaRefused("bad-timestamp", f"'occurred_at' is not ISO-8601: {value[:40]!r}") from None
        return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp() * 1000)
    raise SchemaRefused("bad-timestamp", "'occurred_at' must be an ISO-8601 string or epoch milliseconds")


def _property_change(d: Any, i: int) -> PropertyChange:
    if not isinstance(d, dict):
        raise SchemaRefused("bad-change", f"changes[{i}] must be an object")
    try:
        op = Op(str(d.get("op")))
    except ValueError:
        raise SchemaRefused("unknown-op", f"changes[{i}].op must be one of {', '.join(Op)}") from None
    pid = d.get("id")
    if not isinstance(pid, str) or not _PID.fullmatch(pid):
        raise SchemaRefused("bad-property-id", f"changes[{i}].id must match {_PID.pattern}")
    name = check_name(d.get("name"), f"changes[{i}].name") if op in (Op.ADD, Op.RENAME) else None
    typ = PropType.parse(d.get("type")) if op in (Op.ADD, Op.WIDEN) else None
    return PropertyChange(op, pid, name, typ)


def validate_change(doc: Any) -> SchemaChange:
    """Check a decoded ``schema.updated`` document; raises SchemaRefused with a reason."""
    if not isinstance(doc, dict):
        raise SchemaRefused("not-an-object", "a schema change must be a JSON object")
    change_id = _str(doc, "change_id")
    world = doc.get("world_id")
    if world != ALL_WORLDS:
        try:
            world = validate_world_id(world)
        except InvalidWorldId as exc:
            raise SchemaRefused("bad-world-id", str(exc)) from None
    try:
        kind = EntityKind(str(doc.get("kind")))
    except ValueError:
        raise SchemaRefused("bad-kind", "'kind' must be 'object' or 'link'") from None
    type_name = check_name(doc.get("type_name"), "type_name")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 2**31:
        raise SchemaRefused("bad-version", "'version' must be an integer >= 1 (the type's version after the change)")
    raw = doc.get("changes")
    if not isinstance(raw, list) or not raw:
        raise SchemaRefused("no-changes", "'changes' must be a non-empty list")
    changes = tuple(_property_change(d, i) for i, d in enumerate(raw))
    return SchemaChange(change_id, world, kind, type_name, version, _timestamp_ms(doc.get("occurred_at")), changes)


def decode_change(value: bytes | None) -> SchemaChange | Invalid:
    """Decode one ``schema.updated`` record; never raises on bad input."""
    if value is None:
        return Invalid("tombstone", "a null value is not a schema change")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return Invalid("malformed-json", f"value is not valid UTF-8 JSON: {exc}")
    try:
        return validate_change(doc)
    except SchemaRefused as exc:
        cid = doc.get("change_id") if isinstance(doc, dict) else None
        world = doc.get("world_id") if isinstance(doc, dict) else None
        return Invalid(
            exc.reason, exc.detail, cid if isinstance(cid, str) else None, world if isinstance(world, str) else None
        )


# --- answers and the version vector ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StorageSchemaUpdated:
    """The data layer's answer on ``storage.schema.updated`` (key ``"<world>::<kind>:<type>"``).

    ``version`` is the type's schema version on the world branch after handling the change (for a
    refusal: unchanged); ``world_version`` is the sum over the world's types (its version-vector
    entry). ``status``: applied | duplicate | refused (``reason``/``detail`` say why).
    """

    change_id: str
    world_id: str
    kind: str
    type_name: str
    requested_version: int
    version: int
    world_version: int
    status: str
    commit: str | None = None
    reason: str | None = None
    detail: str | None = None
    handled_at_ms: int = 0
    lag_ms: int | None = None

    @property
    def key(self) -> bytes:
        return f"{self.world_id}::{self.kind}:{self.type_name}".encode()

    def encode(self) -> bytes:
        return orjson.dumps({k: getattr(self, k) for k in self.__slots__})

    @classmethod
    def decode(cls, value: bytes) -> StorageSchemaUpdated:
        return cls(**orjson.loads(value))

    @classmethod
    def undecodable(
        cls, value: bytes | None, invalid: Invalid, *, world_version: int, at_ms: int
    ) -> StorageSchemaUpdated:
        """The ``refused`` answer to a change that did not decode: whatever fields could be read.

        Unreadable fields are empty (``""``, version 0), so the control plane can still match the
        answer to its change by ``change_id`` (or by key) and read ``reason``/``detail``.
        """
        try:
            doc = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            doc = None
        doc = doc if isinstance(doc, dict) else {}

        def text(name: str) -> str:
            v = doc.get(name)
            return v[:MAX_ID_LEN] if isinstance(v, str) else ""

        version = doc.get("version")
        version = version if isinstance(version, int) and not isinstance(version, bool) else 0
        return cls(
            change_id=text("change_id"),
            world_id=invalid.world_id or text("world_id"),
            kind=text("kind"),
            type_name=text("type_name"),
            requested_version=version,
            version=0,
            world_version=world_version,
            status="refused",
            reason=invalid.reason,
            detail=invalid.detail,
            handled_at_ms=at_ms,
        )


@dataclass
class VersionVector:
    """Per-world schema versions of the three layers (the seed's version vector).

    A layer's version of a world is the sum of its per-type versions, i.e. how many schema changes
    of that world it has taken in (versions are consecutive per type).
    """

    control: dict[str, int] = field(default_factory=dict)  # "kind:type" -> highest version announced
    data: dict[str, int] = field(default_factory=dict)  # "kind:type" -> version on the branch
    intelligence: int | None = None

    def saw_control(self, type_key: str, version: int) -> None:
        self.control[type_key] = max(self.control.get(type_key, 0), version)

    def set_data(self, type_key: str, version: int) -> None:
        self.data[type_key] = version
        self.saw_control(type_key, version)  # the control plane issued whatever the branch holds

    def versions(self) -> dict[str, int]:
        out = {"control": sum(self.control.values()), "data": sum(self.data.values())}
        if self.intelligence is not None:
            out["intelligence"] = self.intelligence
        return out

    def difference(self) -> int:
        v = self.versions().values()
        return max(v) - min(v)

    def lagging(self) -> str | None:
        v = self.versions()
        top = max(v.values())
        return next((layer for layer, n in v.items() if n < top), None)
