"""The change-event contract: what ontology services and the CDC ingest publish, and its validation.

Wire format (JSON object, one per Kafka record, key ``"<world_id>::<object_pk|link_pk>"``)::

    event_id          str, required, unique: the idempotency key (1..200 chars)
    world_id          str, required: a valid world id (see models.worlds)
    object_type       str, required for objects;  link_type / link_pk / from_pk / to_pk for links
    object_pk         str, required for objects
    change_type       CREATE | UPDATE | DELETE | SNAPSHOT | TRUNCATE
    before_properties object or null
    after_properties  object or null (required for CREATE, UPDATE, SNAPSHOT)
    version           int >= 0, per entity, increasing
    caused_by         event_id of the cause, or null
    causal_order      int or null (informational ordering hint from the producer)
    occurred_at       ISO-8601 string or epoch milliseconds
    schema_version    int >= 0 (default 0)
    source            str (default "")
    unchanged_properties  list of property names the source did not send (optional): their stored
                      values are kept, never overwritten (Debezium's unavailable-value placeholder)

``decode`` never raises on bad input: it returns an ``Invalid`` with a stable reason code that goes
into the dead-letter headers, and a sentence a producer can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson

from models.worlds import InvalidWorldId, validate_world_id

MAX_ID_LEN = 200
MAX_PK_LEN = 512


class ChangeType(StrEnum):
    CREATE = "CREATE"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    SNAPSHOT = "SNAPSHOT"  # a CDC snapshot read: an upsert that does not imply a prior state
    TRUNCATE = "TRUNCATE"  # every entity of (world, type) is deleted; entity_pk is "*"


class EntityKind(StrEnum):
    OBJECT = "object"
    LINK = "link"


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    event_id: str
    world_id: str
    kind: EntityKind
    entity_type: str  # object_type or link_type
    entity_pk: str  # object_pk or link_pk
    change_type: ChangeType
    version: int
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    caused_by: str | None
    causal_order: int | None
    occurred_at_ms: int
    schema_version: int
    source: str
    from_pk: str | None = None
    to_pk: str | None = None
    #: Properties the source left out of ``after`` because it did not send them (Debezium's
    #: unavailable-value placeholder, e.g. unchanged TOAST columns): the stored values are kept.
    unchanged: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The Kafka key and the per-entity ordering key."""
        return f"{self.world_id}::{self.entity_pk}"

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "event_id": self.event_id,
            "world_id": self.world_id,
            "change_type": self.change_type.value,
            "before_properties": self.before,
            "after_properties": self.after,
            "version": self.version,
            "caused_by": self.caused_by,
            "causal_order": self.causal_order,
            "occurred_at": self.occurred_at_ms,
            "schema_version": self.schema_version,
            "source": self.source,
        }
        if self.kind is EntityKind.OBJECT:
            doc["object_type"] = self.entity_type
            doc["object_pk"] = self.entity_pk
        else:
            doc["link_type"] = self.entity_type
            doc["link_pk"] = self.entity_pk
            doc["from_pk"] = self.from_pk
            doc["to_pk"] = self.to_pk
        if self.unchanged:
            doc["unchanged_properties"] = list(self.unchanged)
        return doc

    def encode(self) -> bytes:
        return orjson.dumps(self.to_wire())


class _EventDraft:
    """A mutable twin of :class:`ChangeEvent` (the same slots, in the same order) for the decoder's
    fast path: filled with plain slot stores, then turned into a real, frozen ``ChangeEvent`` by
    assigning its class (CPython allows it between classes of one layout).

    Why: a frozen dataclass's ``__init__`` sets each of the 17 fields through ``object.__setattr__``
    (~2.3 µs per event, a third of the fast path's CPU); this costs ~0.5 µs. ``new_event`` returns
    exactly what ``ChangeEvent(...)`` returns (``tests/unit/test_models_events_fast_path.py``).
    """

    __slots__ = ChangeEvent.__slots__

    def __init__(
        self,
        event_id: str,
        world_id: str,
        kind: EntityKind,
        entity_type: str,
        entity_pk: str,
        change_type: ChangeType,
        version: int,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        caused_by: str | None,
        causal_order: int | None,
        occurred_at_ms: int,
        schema_version: int,
        source: str,
        from_pk: str | None,
        to_pk: str | None,
        unchanged: tuple[str, ...],
    ) -> None:
        self.event_id = event_id
        self.world_id = world_id
        self.kind = kind
        self.entity_type = entity_type
        self.entity_pk = entity_pk
        self.change_type = change_type
        self.version = version
        self.before = before
        self.after = after
        self.caused_by = caused_by
        self.causal_order = causal_order
        self.occurred_at_ms = occurred_at_ms
        self.schema_version = schema_version
        self.source = source
        self.from_pk = from_pk
        self.to_pk = to_pk
        self.unchanged = unchanged


def new_event(*fields: Any) -> ChangeEvent:
    """``ChangeEvent(*fields)`` (every field, positionally), built through :class:`_EventDraft`."""
    draft = _EventDraft(*fields)
    draft.__class__ = ChangeEvent  # type: ignore[assignment]
    return draft  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why a record was rejected. ``reason`` is a stable code; ``detail`` tells the producer what to fix."""

    reason: str
    detail: str
    event_id: str | None = None
    world_id: str | None = None


class _Reject(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail


def _str_field(doc: dict[str, Any], name: str, max_len: int, required: bool = True) -> str | None:
    value = doc.get(name)
    if value is None:
        if required:
            raise _Reject("missing-field", f"'{name}' is required")
        return None
    if not isinstance(value, str):
        raise _Reject("wrong-type", f"'{name}' must be a string, got {type(value).__name__}")
    if not value.strip():
        if required:
            raise _Reject("empty-field", f"'{name}' must not be empty")
        return None
    if len(value) > max_len:
        raise _Reject("field-too-long", f"'{name}' has {len(value)} characters; at most {max_len}")
    if "\x00" in value:
        raise _Reject("bad-characters", f"'{name}' contains a NUL character")
    return value


def _int_field(doc: dict[str, Any], name: str, default: int | None) -> int | None:
    value = doc.get(name)
    if value is None:
        if default is None and name == "version":
            raise _Reject("missing-field", f"'{name}' is required")
        return default
    # bool is an int subclass in Python; a producer sending true/false made a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Reject("wrong-type", f"'{name}' must be an integer, got {type(value).__name__}")
    if value < 0:
        raise _Reject("negative-number", f"'{name}' must be >= 0, got {value}")
    if value > 2**63 - 1:
        raise _Reject("number-too-large", f"'{name}' does not fit in 64 bits")
    return value


def _props(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Reject("wrong-type", f"'{name}' must be an object or null, got {type(value).__name__}")
    return value


def parse_timestamp_ms(value: Any) -> int:
    """Epoch milliseconds from an int (ms) or an ISO-8601 string; naive strings are taken as UTC."""
    if isinstance(value, bool):
        raise _Reject("wrong-type", "'occurred_at' must be an ISO-8601 string or epoch milliseconds")
    if isinstance(value, int):
        if value < 0:
            raise _Reject("bad-timestamp", "'occurred_at' must not be negative")
        return value
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise _Reject("bad-timestamp", f"'occurred_at' is not ISO-8601: {value[:40]!r}") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return int(dt.timestamp() * 1000)
    if value is None:
        raise _Reject("missing-field", "'occurred_at' is required")
    raise _Reject("wrong-type", "'occurred_at' must be an ISO-8601 string or epoch milliseconds")


_CHANGE_TYPES = {t.value: t for t in ChangeType}
# Members as module constants: an enum member read through its class is an attribute lookup on
# the enum type (~0.2 µs in 3.11), a few of them per event on the fast path.
_TRUNCATE, _DELETE = ChangeType.TRUNCATE, ChangeType.DELETE
_OBJECT, _LINK = EntityKind.OBJECT, EntityKind.LINK
_MAX_INT = 2**63 - 1
#: World ids ``validate_world_id`` accepted (a worker sees a handful): the fast path skips the pattern.
_VALID_WORLDS: set[str] = set()
_VALID_WORLDS_MAX = 4096


def _valid_world(world_id: str) -> bool:
    if world_id in _VALID_WORLDS:
        return True
    try:
        validate_world_id(world_id)
    except InvalidWorldId:
        return False
    if len(_VALID_WORLDS) >= _VALID_WORLDS_MAX:
        _VALID_WORLDS.clear()
    _VALID_WORLDS.add(world_id)
    return True


def _text(value: Any, max_len: int) -> bool:
    """What ``_str_field`` accepts as a present value: a non-blank str, short enough, no NUL."""
    return type(value) is str and 0 < len(value) <= max_len and "\x00" not in value and not value.isspace()


def _texts(a: Any, a_max: int, b: Any, b_max: int) -> bool:
    """``_text`` of two fields in one call: the fast path checks its fields in pairs (a type and its
    key, a link's two ends), and a call a field was ~0.1 µs of the decoder's ~5 µs an event."""
    return (
        type(a) is str
        and type(b) is str
        and 0 < len(a) <= a_max
        and 0 < len(b) <= b_max
        and "\x00" not in a
        and not a.isspace()
        and "\x00" not in b
        and not b.isspace()
    )


def _fast_event(doc: dict[str, Any], topic_kind: EntityKind | None) -> ChangeEvent | None:
    """The common, well-formed event in one pass: the same ``ChangeEvent`` that ``validate`` builds,
    or None when anything is unusual (then ``validate``'s field-by-field path decides, and says why).

    Why: field-by-field validation cost ~8 µs per event, most of the worker's decode (docs/benchmarks.md).
    The integer checks are written out and the text checks go in pairs (``_texts``) where most
    events pass (a call a field: 8-10 of them an event, ~0.1 µs each in 3.11); the rarer shapes (a
    DELETE's absent link ends) keep ``_text``.
    """
    get: Any = doc.get
    event_id, world_id, change = get("event_id"), get("world_id"), get("change_type")
    if type(event_id) is not str or type(world_id) is not str or type(change) is not str:
        return None
    if not (0 < len(event_id) <= MAX_ID_LEN and "\x00" not in event_id and not event_id.isspace()):
        return None
    change_type = _CHANGE_TYPES.get(change)
    if (
        change_type is None
        or change_type is _TRUNCATE
        or (world_id not in _VALID_WORLDS and not _valid_world(world_id))
    ):
        return None
    from_pk = to_pk = None
    if "link_type" in doc or "link_pk" in doc:
        if topic_kind is _OBJECT:
            return None
        kind = _LINK
        entity_type, entity_pk = get("link_type"), get("link_pk")
        from_pk, to_pk = get("from_pk"), get("to_pk")
        if change_type is _DELETE:
            if not ((from_pk is None or _text(from_pk, MAX_PK_LEN)) and (to_pk is None or _text(to_pk, MAX_PK_LEN))):
                return None
        elif not _texts(from_pk, MAX_PK_LEN, to_pk, MAX_PK_LEN):
            return None
    else:
        if topic_kind is _LINK:
            return None
        kind = _OBJECT
        entity_type, entity_pk = get("object_type"), get("object_pk")
    if not _texts(entity_type, MAX_ID_LEN, entity_pk, MAX_PK_LEN):
        return None
    before, after = get("before_properties"), get("after_properties")
    if (before is not None and type(before) is not dict) or (after is not None and type(after) is not dict):
        return None
    if after is None and change_type is not _DELETE:
        return None
    version, caused_by, causal_order = get("version"), get("caused_by"), get("causal_order")
    if type(version) is not int or not 0 <= version <= _MAX_INT:
        return None
    if causal_order is not None and (type(causal_order) is not int or not 0 <= causal_order <= _MAX_INT):
        return None
    if caused_by is not None and (
        type(caused_by) is not str
        or not 0 < len(caused_by) <= MAX_ID_LEN
        or "\x00" in caused_by
        or caused_by.isspace()
        or caused_by == event_id
    ):
        return None
    occurred_at, schema_version = get("occurred_at"), get("schema_version")
    if type(occurred_at) is not int or occurred_at < 0:
        return None
    if schema_version is None:
        schema_version = 0
    elif type(schema_version) is not int or not 0 <= schema_version <= _MAX_INT:
        return None
    source = get("source") or ""
    if type(source) is not str:
        return None
    unchanged: Any = get("unchanged_properties")
    if not unchanged:  # absent, null or empty: most events (no generator for them)
        unchanged = ()
    elif type(unchanged) is not list or not all(type(u) is str for u in unchanged):
        return None
    # The draft directly, not through ``new_event(*fields)``: one call and one argument tuple less.
    event = _EventDraft(
        event_id,
        world_id,
        kind,
        entity_type,
        entity_pk,
        change_type,
        version,
        before,
        after,
        caused_by,
        causal_order,
        occurred_at,
        schema_version,
        source[:MAX_ID_LEN],
        from_pk,
        to_pk,
        tuple(unchanged),
    )
    event.__class__ = ChangeEvent  # type: ignore[assignment]
    return event  # type: ignore[return-value]


def validate(doc: Any, topic_kind: EntityKind | None = None) -> ChangeEvent:
    """Check a decoded JSON document against the contract; raises _Reject."""
    if type(doc) is dict:
        event = _fast_event(doc, topic_kind)
        if event is not None:
            return event
    return validate_fields(doc, topic_kind)


def validate_fields(doc: Any, topic_kind: EntityKind | None = None) -> ChangeEvent:
    """``validate`` field by field, in the contract's order: the first problem found is the reason."""
    if not isinstance(doc, dict):
        raise _Reject("not-an-object", f"the value must be a JSON object, got {type(doc).__name__}")
    event_id = _str_field(doc, "event_id", MAX_ID_LEN)
    assert event_id is not None
    raw_world = doc.get("world_id")
    if raw_world is None:
        raise _Reject("missing-field", "'world_id' is required")
    try:
        world_id = validate_world_id(raw_world)
    except InvalidWorldId as exc:
        raise _Reject("bad-world-id", str(exc)) from None

    is_link = "link_type" in doc or "link_pk" in doc
    if topic_kind is EntityKind.LINK and not is_link:
        raise _Reject("wrong-topic", "object events belong on the objects topic; links need link_type")
    if topic_kind is EntityKind.OBJECT and is_link:
        raise _Reject("wrong-topic", "link events belong on the links topic")

    raw_change: Any = doc.get("change_type")
    try:
        change_type = ChangeType(raw_change)
    except ValueError:
        raise _Reject(
            "unknown-change-type",
            f"change_type {str(raw_change)[:40]!r} is not one of {', '.join(ChangeType)}",
        ) from None

    from_pk = to_pk = None
    entity_type: str | None
    entity_pk: str | None
    if is_link:
        kind = EntityKind.LINK
        entity_type = _str_field(doc, "link_type", MAX_ID_LEN)
        if change_type is ChangeType.TRUNCATE:
            entity_pk = "*"
        else:
            entity_pk = _str_field(doc, "link_pk", MAX_PK_LEN)
            from_pk = _str_field(doc, "from_pk", MAX_PK_LEN, required=change_type is not ChangeType.DELETE)
            to_pk = _str_field(doc, "to_pk", MAX_PK_LEN, required=change_type is not ChangeType.DELETE)
    else:
        kind = EntityKind.OBJECT
        entity_type = _str_field(doc, "object_type", MAX_ID_LEN)
        entity_pk = "*" if change_type is ChangeType.TRUNCATE else _str_field(doc, "object_pk", MAX_PK_LEN)
    assert entity_type is not None and entity_pk is not None

    before = _props(doc, "before_properties")
    after = _props(doc, "after_properties")
    if change_type in (ChangeType.CREATE, ChangeType.UPDATE, ChangeType.SNAPSHOT) and after is None:
        raise _Reject("missing-after", f"a {change_type} needs after_properties")

    version = _int_field(doc, "version", None)
    assert version is not None
    caused_by = _str_field(doc, "caused_by", MAX_ID_LEN, required=False)
    if caused_by == event_id:
        raise _Reject("self-caused", "caused_by names the event itself")
    causal_order = _int_field(doc, "causal_order", None) if doc.get("causal_order") is not None else None
    occurred_at_ms = parse_timestamp_ms(doc.get("occurred_at"))
    schema_version = _int_field(doc, "schema_version", 0)
    assert schema_version is not None
    source = doc.get("source") or ""
    if not isinstance(source, str):
        raise _Reject("wrong-type", "'source' must be a string")
    unchanged = doc.get("unchanged_properties") or []
    if not isinstance(unchanged, list) or not all(isinstance(u, str) for u in unchanged):
        raise _Reject("wrong-type", "'unchanged_properties' must be a list of property names")

    return ChangeEvent(
        event_id=event_id,
        world_id=world_id,
        kind=kind,
        entity_type=entity_type,
        entity_pk=entity_pk,
        change_type=change_type,
        version=version,
        before=before,
        after=after,
        caused_by=caused_by,
        causal_order=causal_order,
        occurred_at_ms=occurred_at_ms,
        schema_version=schema_version,
        source=source[:MAX_ID_LEN],
        from_pk=from_pk,
        to_pk=to_pk,
        unchanged=tuple(unchanged),
    )


def decode(
    value: bytes | None,
    key: bytes | None = None,
    topic_kind: EntityKind | None = None,
    max_bytes: int = 1_048_576,
) -> ChangeEvent | Invalid:
    """Decode and validate one Kafka record value; never raises on bad input."""
    if value is None:
        return Invalid("tombstone", "a null value (tombstone) is not a change event")
    if len(value) > max_bytes:
        return Invalid("oversized", f"value is {len(value)} bytes; the limit is {max_bytes}")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return Invalid("malformed-json", f"value is not valid UTF-8 JSON: {exc}")
    try:
        event = validate(doc, topic_kind)
    except _Reject as rej:
        ev_id = doc.get("event_id") if isinstance(doc, dict) else None
        world = doc.get("world_id") if isinstance(doc, dict) else None
        return Invalid(
            rej.reason,
            rej.detail,
            ev_id if isinstance(ev_id, str) else None,
            world if isinstance(world, str) else None,
        )
    if key is not None:
        expected = f"{event.world_id}::{event.entity_pk}".encode()  # ``event.key``, without the property call
        if key != expected:
            return Invalid(
                "key-mismatch",
                f"record key {key[:120]!r} must be '<world_id>::<pk>' = {expected[:120]!r}",
                event.event_id,
                event.world_id,
            )
    return event
