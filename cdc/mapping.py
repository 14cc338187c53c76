"""CDC mapping: which source table becomes which world and entity type (pure: records and validation).

The mapping is a YAML or JSON document (``CAUSEWAY_CDC_MAPPING`` = a file path, or the JSON itself),
read by ``cdc.mapping_loader`` and validated here once at start-up: every problem is reported at once
with its path (``tables[2].pk: ...``). See docs/cdc.md for the format and an example.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cdc.debezium import UNAVAILABLE_PLACEHOLDER, SourceInfo, check_hint
from models.errors import InputError
from models.events import EntityKind
from models.worlds import InvalidWorldId, validate_world_id

TOPIC_PREFIX = "cdc.raw."
UnmappedPolicy = Literal["dlq", "skip"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,199}")
_SOURCE_KEYS = ("connector", "name", "db", "schema", "table")


class MappingError(InputError, ValueError):
    """The mapping config cannot be used; ``problems`` lists every one, each with its path."""

    def __init__(self, problems: list[str], origin: str = "CDC mapping") -> None:
        self.problems = problems
        super().__init__(f"{origin} is invalid:\n  " + "\n  ".join(problems))


@dataclass(frozen=True, slots=True)
class TableMapping:
    """How one source table becomes ontology change events."""

    label: str  # where it was declared, for messages: "tables[3]"
    kind: EntityKind
    entity_type: str
    pk: tuple[str, ...]
    topic: str | None = None
    source: tuple[tuple[str, str], ...] = ()  # (key, value) pairs that must all match source.*
    world: str | None = None  # fixed world, or
    world_column: str | None = None  # world taken from this column
    truncate_worlds: tuple[str, ...] = ()  # worlds a truncate applies to when the world is a column
    from_columns: tuple[str, ...] = ()  # links only
    to_columns: tuple[str, ...] = ()
    rename: Mapping[str, str] = field(default_factory=dict)
    column_types: Mapping[str, str] = field(default_factory=dict)
    schema_version: int = 0

    def matches_source(self, src: SourceInfo) -> bool:
        return bool(self.source) and all(getattr(src, k) == v for k, v in self.source)


@dataclass(frozen=True, slots=True)
class CdcMapping:
    tables: tuple[TableMapping, ...]
    unmapped: UnmappedPolicy = "dlq"
    placeholder: str = UNAVAILABLE_PLACEHOLDER
    by_topic: Mapping[str, TableMapping] = field(default_factory=dict)

    def lookup(self, topic: str, source: SourceInfo) -> TableMapping | None:
        """A topic match wins; else the first ``source`` match in declaration order."""
        hit = self.by_topic.get(topic)
        if hit is not None:
            return hit
        for table in self.tables:
            if table.matches_source(source):
                return table
        return None


# --- validation -------------------------------------------------------------------------------


def parse_mapping(doc: Any, origin: str = "CDC mapping") -> CdcMapping:
    problems: list[str] = []
    if not isinstance(doc, Mapping):
        raise MappingError([f"the top level must be a mapping, got {type(doc).__name__}"], origin)
    for key in doc:
        if key not in ("tables", "unmapped", "unavailable_placeholder"):
            problems.append(f"{key}: unknown key (expected tables, unmapped, unavailable_placeholder)")
    unmapped = doc.get("unmapped", "dlq")
    if unmapped not in ("dlq", "skip"):
        problems.append(f"unmapped: {unmapped!r} must be 'dlq' or 'skip'")
    placeholder = doc.get("unavailable_placeholder", UNAVAILABLE_PLACEHOLDER)
    if not isinstance(placeholder, str) or not placeholder:
        problems.append("unavailable_placeholder: must be a non-empty string")
    raw_tables = doc.get("tables")
    tables: list[TableMapping] = []
    if not isinstance(raw_tables, list) or not raw_tables:
        problems.append("tables: must be a non-empty list of table mappings")
    else:
        for i, raw in enumerate(raw_tables):
            table = _parse_table(raw, f"tables[{i}]", problems)
            if table is not None:
                tables.append(table)
    # Duplicates are looked for in the raw entries, so an entry with another problem is reported too.
    first_label: dict[str, str] = {}
    for i, raw in enumerate(raw_tables if isinstance(raw_tables, list) else ()):
        topic = raw.get("topic") if isinstance(raw, Mapping) else None
        if isinstance(topic, str) and topic:
            if topic in first_label:
                problems.append(f"tables[{i}].topic: {topic!r} is already mapped by {first_label[topic]}")
            else:
                first_label[topic] = f"tables[{i}]"
    by_topic: dict[str, TableMapping] = {}
    seen_sources: dict[tuple[tuple[str, str], ...], str] = {}
    for t in tables:
        if t.topic is not None:
            by_topic.setdefault(t.topic, t)
        if t.source:
            if t.source in seen_sources:
                problems.append(f"{t.label}.source: the same source is already mapped by {seen_sources[t.source]}")
            seen_sources[t.source] = t.label
    if problems:
        raise MappingError(problems, origin)
    return CdcMapping(tuple(tables), unmapped, placeholder, by_topic)


def _columns(raw: Any, path: str, problems: list[str], required: bool = True) -> tuple[str, ...]:
    if raw is None and not required:
        return ()
    cols = [raw] if isinstance(raw, str) else raw
    if not isinstance(cols, list) or not cols or not all(isinstance(c, str) and c for c in cols):
        problems.append(f"{path}: must be a column name or a non-empty list of column names")
        return ()
    if len(set(cols)) != len(cols):
        problems.append(f"{path}: lists a column twice")
    return tuple(cols)


def _type_name(raw: Any, path: str, problems: list[str]) -> str:
    if not isinstance(raw, str) or not _NAME.fullmatch(raw):
        problems.append(f"{path}: {raw!r} must be a type name (letters, digits, _ . -; at most 200)")
        return ""
    return raw


def _parse_table(raw: Any, label: str, problems: list[str]) -> TableMapping | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{label}: must be a mapping")
        return None
    known = {
        "topic", "source", "world", "object_type", "link", "pk", "rename",
        "column_types", "truncate_worlds", "schema_version",
    }  # fmt: skip
    for key in raw:
        if key not in known:
            problems.append(f"{label}.{key}: unknown key (expected one of {', '.join(sorted(known))})")
    start = len(problems)

    topic = raw.get("topic")
    source: tuple[tuple[str, str], ...] = ()
    if topic is not None and (not isinstance(topic, str) or not topic.startswith(TOPIC_PREFIX)):
        problems.append(f"{label}.topic: {topic!r} must be a topic name starting with {TOPIC_PREFIX!r}")
    raw_source = raw.get("source")
    if raw_source is not None:
        if not isinstance(raw_source, Mapping) or not raw_source.get("table"):
            problems.append(f"{label}.source: must be a mapping with at least 'table' ({', '.join(_SOURCE_KEYS)})")
        else:
            for k, v in raw_source.items():
                if k not in _SOURCE_KEYS:
                    problems.append(f"{label}.source.{k}: unknown key (expected {', '.join(_SOURCE_KEYS)})")
                elif not isinstance(v, str) or not v:
                    problems.append(f"{label}.source.{k}: must be a non-empty string")
            source = tuple(sorted((str(k), str(v)) for k, v in raw_source.items()))
    if topic is None and raw_source is None:
        problems.append(f"{label}: needs 'topic' (cdc.raw.<source>.<table>) or 'source' (db/schema/table)")

    world = world_column = None
    raw_world = raw.get("world")
    if isinstance(raw_world, Mapping):
        col = raw_world.get("column")
        if set(raw_world) != {"column"} or not isinstance(col, str) or not col:
            problems.append(f"{label}.world: use a world id, or {{column: <column name>}}")
        else:
            world_column = col
    else:
        try:
            world = validate_world_id(raw_world)
        except InvalidWorldId as exc:
            problems.append(f"{label}.world: {exc} (or use {{column: <column name>}})")
    truncate_worlds: list[str] = []
    for j, w in enumerate(raw.get("truncate_worlds") or []):
        try:
            truncate_worlds.append(validate_world_id(w))
        except InvalidWorldId as exc:
            problems.append(f"{label}.truncate_worlds[{j}]: {exc}")
    if world is not None and raw.get("truncate_worlds"):
        problems.append(f"{label}.truncate_worlds: only for a world taken from a column")

    has_object, has_link = "object_type" in raw, "link" in raw
    kind = EntityKind.OBJECT
    entity_type = ""
    from_cols: tuple[str, ...] = ()
    to_cols: tuple[str, ...] = ()
    if has_object == has_link:
        problems.append(f"{label}: give exactly one of 'object_type' or 'link' ({{type, from, to}})")
    elif has_object:
        entity_type = _type_name(raw["object_type"], f"{label}.object_type", problems)
    else:
        kind = EntityKind.LINK
        link = raw["link"]
        if not isinstance(link, Mapping) or set(link) != {"type", "from", "to"}:
            problems.append(f"{label}.link: must be {{type: <link type>, from: [columns], to: [columns]}}")
        else:
            entity_type = _type_name(link["type"], f"{label}.link.type", problems)
            from_cols = _columns(link["from"], f"{label}.link.from", problems)
            to_cols = _columns(link["to"], f"{label}.link.to", problems)
    pk = _columns(raw.get("pk"), f"{label}.pk", problems)

    rename = raw.get("rename") or {}
    if not isinstance(rename, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in rename.items()
    ):
        problems.append(f"{label}.rename: must map source column names to property names")
        rename = {}
    elif len(set(rename.values())) != len(rename):
        problems.append(f"{label}.rename: two columns are renamed to the same property")
    column_types = raw.get("column_types") or {}
    if not isinstance(column_types, Mapping):
        problems.append(f"{label}.column_types: must map column names to types")
        column_types = {}
    for col, hint in column_types.items():
        why = check_hint(hint) if isinstance(hint, str) else "must be a string"
        if why:
            problems.append(f"{label}.column_types.{col}: {why}")
    schema_version = raw.get("schema_version", 0)
    if isinstance(schema_version, bool) or not isinstance(schema_version, int) or schema_version < 0:
        problems.append(f"{label}.schema_version: must be an integer >= 0")

    if len(problems) > start:
        return None
    return TableMapping(
        label=label,
        kind=kind,
        entity_type=entity_type,
        pk=pk,
        topic=topic,
        source=source,
        world=world,
        world_column=world_column,
        truncate_worlds=tuple(truncate_worlds),
        from_columns=from_cols,
        to_columns=to_cols,
        rename=dict(rename),
        column_types=dict(column_types),
        schema_version=schema_version,
    )
