"""A deterministic workload of change events, and the model of the state it must produce.

``generate(params)`` returns the records to publish, in publish order, and ``expected_state`` computes
what the branches must hold once every record is processed: per world, the live objects and links
(last version wins; a DELETE removes), and the set of event ids in the event log. Tests and the
benchmark compare Iceberg state read back with this model.

Knobs: events, worlds, keys per world, the create/update/delete/link mix, the share of events with
a ``caused_by`` on another key (some with the cause published after the effect), the duplicate rate
(an identical record published again, as a producer retry would) and the bad-input rate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson

from models.events import ChangeEvent, ChangeType, EntityKind

OBJECT_TYPES = ("Equipment", "Department", "Sensor")
BASE_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class WorkloadParams:
    events: int = 2_000
    worlds: int = 2
    keys: int = 200  # objects per world
    seed: int = 7
    update_share: float = 0.6
    delete_share: float = 0.05
    link_share: float = 0.15
    causal_share: float = 0.1
    late_cause_share: float = 0.5  # of causal events: the cause is published after the effect
    duplicate_rate: float = 0.02
    bad_rate: float = 0.01
    world_prefix: str = "w"
    id_prefix: str = ""  # event ids are "<id_prefix>ev-<seed>-<n>": unique prefixes keep runs apart
    pk_prefix: str = ""  # object / link pks are "<pk_prefix>obj-<n>" / "<pk_prefix>lnk-<n>" (no "-" in it)

    def world_ids(self) -> list[str]:
        return ["prod"] + [f"{self.world_prefix}{i}" for i in range(1, self.worlds)]


@dataclass(frozen=True)
class Record:
    kind: EntityKind  # which change topic
    key: bytes
    value: bytes
    event: ChangeEvent | None  # None for bad input


@dataclass
class Workload:
    params: WorkloadParams
    records: list[Record] = field(default_factory=list)

    @property
    def valid_events(self) -> list[ChangeEvent]:
        """Distinct valid events, first occurrence of each event id."""
        seen: set[tuple[str, str]] = set()
        out = []
        for r in self.records:
            if r.event is not None and (r.event.world_id, r.event.event_id) not in seen:
                seen.add((r.event.world_id, r.event.event_id))
                out.append(r.event)
        return out

    @property
    def bad_count(self) -> int:
        return sum(1 for r in self.records if r.event is None)


BAD_VALUES: tuple[bytes, ...] = (
    b"{not json",
    b"[1,2,3]",
    orjson.dumps(
        {
            "event_id": "bad-1",
            "world_id": "main@deadbeef",
            "object_type": "X",
            "object_pk": "1",
            "change_type": "CREATE",
            "after_properties": {},
            "version": 1,
            "occurred_at": 0,
        }
    ),
    orjson.dumps(
        {
            "event_id": "bad-2",
            "world_id": "prod",
            "object_type": "X",
            "object_pk": "1",
            "change_type": "EXPLODE",
            "after_properties": {},
            "version": 1,
            "occurred_at": 0,
        }
    ),
    orjson.dumps({"world_id": "prod", "object_type": "X", "object_pk": "1", "change_type": "CREATE"}),
)


def generate(params: WorkloadParams) -> Workload:
    rng = random.Random(params.seed)
    worlds = params.world_ids()
    wl = Workload(params)
    versions: dict[tuple[str, str], int] = {}
    live: dict[str, list[str]] = {w: [] for w in worlds}
    live_set: dict[str, set[str]] = {w: set() for w in worlds}
    fresh = {w: 0 for w in worlds}
    link_n = 0
    emitted: list[ChangeEvent] = []
    delayed: list[tuple[int, Record]] = []  # (emit after this many more records, record)
    seq = 0

    def make(
        world: str,
        kind: EntityKind,
        etype: str,
        pk: str,
        change: ChangeType,
        after: dict[str, Any] | None,
        caused_by: str | None = None,
        from_pk: str | None = None,
        to_pk: str | None = None,
    ) -> ChangeEvent:
        nonlocal seq
        seq += 1
        vkey = (world, pk)
        versions[vkey] = versions.get(vkey, 0) + 1
        return ChangeEvent(
            event_id=f"{params.id_prefix}ev-{params.seed}-{seq}",
            world_id=world,
            kind=kind,
            entity_type=etype,
            entity_pk=pk,
            change_type=change,
            version=versions[vkey],
            before=None,
            after=after,
            caused_by=caused_by,
            causal_order=seq,
            occurred_at_ms=BASE_TIME_MS + seq,
            schema_version=1,
            source="workload",
            from_pk=from_pk,
            to_pk=to_pk,
        )

    def record(ev: ChangeEvent) -> Record:
        return Record(ev.kind, ev.key.encode(), ev.encode(), ev)

    def push(rec: Record) -> None:
        wl.records.append(rec)
        for item in delayed[:]:
            delayed.remove(item)
            if item[0] <= 1:
                emit_delayed(item[1])
            else:
                delayed.append((item[0] - 1, item[1]))

    def emit_delayed(rec: Record) -> None:
        # A late cause's object becomes visible to later events only once the cause is published,
        # so no update of it can overtake its CREATE.
        wl.records.append(rec)
        assert rec.event is not None
        live[rec.event.world_id].append(rec.event.entity_pk)
        live_set[rec.event.world_id].add(rec.event.entity_pk)

    def new_object(world: str) -> tuple[str, str]:
        fresh[world] += 1
        pk = f"{params.pk_prefix}obj-{fresh[world]}"
        return pk, OBJECT_TYPES[fresh[world] % len(OBJECT_TYPES)]

    while len(wl.records) + len(delayed) < params.events:
        roll = rng.random()
        if roll < params.bad_rate:
            push(Record(EntityKind.OBJECT, b"prod::bad", rng.choice(BAD_VALUES), None))
            continue
        if roll < params.bad_rate + params.duplicate_rate and emitted:
            push(record(rng.choice(emitted[-500:])))
            continue
        world = rng.choice(worlds)
        cause: ChangeEvent | None = None
        late = False
        if rng.random() < params.causal_share:
            late = rng.random() < params.late_cause_share
            if late:
                # The cause creates a fresh object and is published a few records after its effect;
                # nothing else touches that object until then, so per-key order still holds.
                pk, otype = new_object(world)
                cause = make(world, EntityKind.OBJECT, otype, pk, ChangeType.CREATE, {"name": pk, "status": "new"})
            elif emitted:
                candidates = [e for e in emitted[-200:] if e.world_id == world]
                cause = rng.choice(candidates) if candidates else None
        caused_by = cause.event_id if cause else None
        kind_roll = rng.random()
        if kind_roll < params.link_share and len(live[world]) >= 2:
            a, b = rng.sample(live[world], 2)
            link_n += 1
            ev = make(
                world,
                EntityKind.LINK,
                "connected_to",
                f"{params.pk_prefix}lnk-{link_n}",
                ChangeType.CREATE,
                {"weight": rng.randint(1, 9)},
                caused_by,
                from_pk=a,
                to_pk=b,
            )
        elif (
            live[world]
            and len(live[world]) >= min(params.keys, 8)
            and kind_roll < params.link_share + params.update_share
        ):
            pk = rng.choice(live[world])
            etype = OBJECT_TYPES[int(pk.rsplit("-", 1)[1]) % len(OBJECT_TYPES)]
            if rng.random() < params.delete_share / max(params.update_share, 1e-9):
                ev = make(world, EntityKind.OBJECT, etype, pk, ChangeType.DELETE, None, caused_by)
                live[world].remove(pk)
                live_set[world].discard(pk)
            else:
                ev = make(
                    world,
                    EntityKind.OBJECT,
                    etype,
                    pk,
                    ChangeType.UPDATE,
                    {
                        "name": pk,
                        "status": rng.choice(["ok", "broken", "repaired"]),
                        "reading": round(rng.random() * 100, 3),
                    },
                    caused_by,
                )
        else:
            if fresh[world] >= params.keys and live[world]:
                pk = rng.choice(live[world])
                etype = OBJECT_TYPES[int(pk.rsplit("-", 1)[1]) % len(OBJECT_TYPES)]
                ev = make(
                    world,
                    EntityKind.OBJECT,
                    etype,
                    pk,
                    ChangeType.UPDATE,
                    {"name": pk, "status": "ok", "reading": 0.0},
                    caused_by,
                )
            else:
                pk, etype = new_object(world)
                ev = make(
                    world,
                    EntityKind.OBJECT,
                    etype,
                    pk,
                    ChangeType.CREATE,
                    {"name": pk, "status": "new"},
                    caused_by,
                )
                live[world].append(pk)
                live_set[world].add(pk)
        push(record(ev))
        emitted.append(ev)
        if cause is not None and late:
            delayed.append((rng.randint(1, 20), record(cause)))
            emitted.append(cause)
    for _, rec in sorted(delayed, key=lambda item: item[0]):
        emit_delayed(rec)
    return wl


@dataclass
class WorldState:
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # pk -> {type, version, properties}
    links: dict[str, dict[str, Any]] = field(default_factory=dict)
    event_ids: set[str] = field(default_factory=set)


def expected_state(events: list[ChangeEvent]) -> dict[str, WorldState]:
    """The model: per world, the highest version of each entity wins; DELETE removes it."""
    out: dict[str, WorldState] = {}
    best: dict[tuple[str, EntityKind, str], ChangeEvent] = {}
    for ev in events:
        ws = out.setdefault(ev.world_id, WorldState())
        ws.event_ids.add(ev.event_id)
        k = (ev.world_id, ev.kind, ev.entity_pk)
        if k not in best or ev.version > best[k].version:
            best[k] = ev
    for (world, kind, pk), ev in best.items():
        if ev.change_type is ChangeType.DELETE:
            continue
        target = out[world].objects if kind is EntityKind.OBJECT else out[world].links
        target[pk] = {"type": ev.entity_type, "version": ev.version, "properties": ev.after}
    return out


# --- Debezium CDC envelopes ---------------------------------------------------------------------------

_DEBEZIUM_OP = {ChangeType.CREATE: "c", ChangeType.UPDATE: "u", ChangeType.DELETE: "d", ChangeType.SNAPSHOT: "r"}


@dataclass(frozen=True)
class CdcRecord:
    topic: str
    key: bytes
    value: bytes


def debezium_topic(source: str, entity_type: str) -> str:
    return f"cdc.raw.{source}.{entity_type.lower()}"


def debezium_records(workload: Workload, source: str = "bench") -> list[CdcRecord]:
    """The workload's valid object and link changes as Postgres-style Debezium envelopes (schemaless JSON).

    One table per object type (and one for links), the world in a ``tenant`` column, the pk in ``id``;
    ``source.lsn`` is the event's sequence number, so versions stay increasing per entity. Causes cannot
    be declared in CDC, so ``caused_by`` is dropped; duplicates are republished byte-identical (a
    connector restart) and bad input stays bad. Feed the topics to ``python -m agents.cdc`` with
    :func:`debezium_mapping`.
    """
    out: list[CdcRecord] = []
    for n, rec in enumerate(workload.records):
        ev = rec.event
        if ev is None:
            out.append(CdcRecord(debezium_topic(source, OBJECT_TYPES[0]), rec.key, rec.value))
            continue
        row_after: dict[str, Any] | None = (
            None if ev.after is None else {"id": ev.entity_pk, "tenant": ev.world_id, **ev.after}
        )
        row_before: dict[str, Any] | None = (
            {"id": ev.entity_pk, "tenant": ev.world_id} if ev.change_type is ChangeType.DELETE else None
        )
        if ev.kind is EntityKind.LINK:
            for row in (row_after, row_before):
                if row is not None:
                    row.update({"from_id": ev.from_pk, "to_id": ev.to_pk})
        table = ev.entity_type.lower()
        payload = {
            "before": row_before,
            "after": row_after,
            "op": _DEBEZIUM_OP[ev.change_type],
            "ts_ms": ev.occurred_at_ms,
            "source": {
                "connector": "postgresql",
                "name": source,
                "db": "bench",
                "schema": "public",
                "table": table,
                "lsn": ev.causal_order or n,
                "ts_ms": ev.occurred_at_ms,
            },
        }
        key = orjson.dumps({"id": ev.entity_pk})
        out.append(CdcRecord(debezium_topic(source, ev.entity_type), key, orjson.dumps(payload)))
    return out


def debezium_mapping(source: str = "bench") -> dict[str, Any]:
    """The CDC mapping (cdc.convert format) that turns :func:`debezium_records` back into events."""
    tables: list[dict[str, Any]] = [
        {"topic": debezium_topic(source, t), "world": {"column": "tenant"}, "object_type": t, "pk": "id"}
        for t in OBJECT_TYPES
    ]
    tables.append(
        {
            "topic": debezium_topic(source, "connected_to"),
            "world": {"column": "tenant"},
            "link": {"type": "connected_to", "from": "from_id", "to": "to_id"},
            "pk": "id",
        }
    )
    return {"unmapped": "dlq", "tables": tables}
