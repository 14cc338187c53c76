"""Schema sync's ordering, fan-out and offset logic, with an in-memory store instead of Nessie."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from agents.schema_sync import SchemaSync, SyncResult
from models.events import EntityKind
from models.schema import SchemaChange, SchemaRefused, StorageSchemaUpdated, TypeSchema, Verdict, decide
from monitoring.metrics import Metrics
from streams.settings import Settings


class MemoryStore:
    """Applies changes to per-world dicts with the real decision rules."""

    def __init__(self, worlds: list[str]) -> None:
        self.applied: dict[tuple[str, str], TypeSchema] = {}
        self.calls: list[tuple[str, int]] = []
        self._worlds = worlds

    def worlds(self) -> list[str]:
        return list(self._worlds)

    def contracts(self, world_id: str) -> dict[tuple[EntityKind, str], TypeSchema]:
        return {(ts.kind, ts.type_name): ts for (w, _), ts in self.applied.items() if w == world_id}

    def apply(self, change: SchemaChange) -> SyncResult:
        self.calls.append((change.world_id, change.version))
        if change.world_id not in self._worlds:  # as SchemaStore: no branch, no change
            empty = TypeSchema(change.kind, change.type_name)
            return SyncResult(change.world_id, "refused", empty, None, "unknown-world", "no branch")
        key = (change.world_id, change.type_name)
        current = self.applied.get(key)
        try:
            d = decide(current, change)
        except SchemaRefused as exc:
            return SyncResult(change.world_id, "refused", current or TypeSchema(change.kind, change.type_name),
                              reason=exc.reason, detail=exc.detail)  # fmt: skip
        if d.verdict is Verdict.APPLY:
            self.applied[key] = d.schema
        return SyncResult(
            change.world_id, d.verdict.value, d.schema, commit="h" if d.verdict is Verdict.APPLY else None
        )


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None


def change(version: int, world: str = "w1", **op: object) -> bytes:
    ops = [op or {"op": "add", "id": f"p{version}", "name": f"n{version}", "type": "int"}]
    return orjson.dumps(
        {"change_id": f"c{version}-{world}", "world_id": world, "kind": "object", "type_name": "T",
         "version": version, "occurred_at": 0, "changes": ops}
    )  # fmt: skip


class Producer:
    """Collects what the agent publishes, by topic."""

    def __init__(self) -> None:
        self.sent: dict[str, list[tuple[bytes | None, bytes]]] = {}

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None, headers: object = None) -> None:
        self.sent.setdefault(topic, []).append((key, value))


def sync(worlds: list[str]) -> tuple[SchemaSync, MemoryStore]:
    store = MemoryStore(worlds)
    s = Settings.from_env({}).replace(schema_topic="schema", schema_answer_topic="answers", dlq_topic="dlq")
    agent = SchemaSync(s, Metrics(), store=store)  # type: ignore[arg-type]
    agent._producer = Producer()  # type: ignore[assignment]
    return agent, store


def answers(agent: SchemaSync) -> list[StorageSchemaUpdated]:
    return [StorageSchemaUpdated.decode(v) for _, v in agent._producer.sent.get("answers", [])]  # type: ignore[union-attr]


def series(agent: SchemaSync, world: str) -> list[str]:
    """Every sample that carries ``world`` as its world label."""
    return [
        f"{m.name}{s.labels}"
        for m in agent.metrics.registry.collect()
        for s in m.samples
        if s.labels.get("world") == world
    ]


async def test_a_gap_waits_and_holds_the_offset_until_it_is_filled() -> None:
    agent, store = sync(["w1"])
    tp = ("schema", 0)
    await agent._handle(Rec("schema", 0, 0, change(1)))
    await agent._handle(Rec("schema", 0, 1, change(3)))
    await agent._handle(Rec("schema", 0, 2, change(4)))
    assert store.applied[("w1", "T")].version == 1
    assert agent._tracker.committable(tp) == 1  # v3 waits: its offset holds the partition
    assert agent.summary()["waiting"] == 2
    await agent._handle(Rec("schema", 0, 3, change(2)))
    assert store.applied[("w1", "T")].version == 4
    assert agent._tracker.committable(tp) == 4 and agent.summary()["waiting"] == 0
    assert agent.vectors["w1"].versions() == {"control": 4, "data": 4}


async def test_all_worlds_fan_out_and_duplicates_are_no_ops() -> None:
    agent, store = sync(["a", "b"])
    await agent._handle(Rec("schema", 0, 0, change(1, world="*")))
    again = orjson.dumps({**orjson.loads(change(1, world="*")), "world_id": "a"})  # same change id, one world
    await agent._handle(Rec("schema", 0, 1, again))  # already applied to a
    assert store.applied[("a", "T")].version == 1 and store.applied[("b", "T")].version == 1
    reg = agent.metrics.registry
    assert reg.get_sample_value("causeway_schema_changes_total", {"world": "a", "outcome": "duplicate", "reason": ""})
    assert agent._tracker.committable(("schema", 0)) == 2


async def test_refused_and_undecodable_changes_settle_their_offsets() -> None:
    agent, store = sync(["w1"])
    await agent._handle(Rec("schema", 0, 0, change(1, op="add", id="p", name="x", type="long")))
    await agent._handle(Rec("schema", 0, 1, change(2, op="widen", id="p", type="int")))
    await agent._handle(Rec("schema", 0, 2, b"not json"))
    assert agent._tracker.committable(("schema", 0)) == 3
    reg = agent.metrics.registry
    refused = {"world": "w1", "outcome": "refused", "reason": "narrowing"}
    assert reg.get_sample_value("causeway_schema_changes_total", refused) == 1
    assert store.applied[("w1", "T")].version == 1


async def test_intelligence_acknowledgements_enter_the_version_vector() -> None:
    agent, _ = sync(["w1"])
    agent.settings = agent.settings.replace(schema_intelligence_topic="intel")
    await agent._handle(Rec("schema", 0, 0, change(1)))
    await agent._handle(Rec("intel", 0, 0, orjson.dumps({"world_id": "w1", "version": 0})))
    reg = agent.metrics.registry
    assert reg.get_sample_value("causeway_version_vector_difference", {"world": "w1"}) == 1


async def test_a_change_that_does_not_decode_is_answered_refused_and_logged(caplog) -> None:  # noqa: ANN001
    """Issue 19.2: bad-type / bad-name changes went only to the dead-letter topic."""
    agent, _ = sync(["w1"])
    await agent._handle(Rec("schema", 0, 0, change(1)))
    bad_type = change(2, op="add", id="p", name="x", type="varchar")
    bad_name = orjson.dumps({**orjson.loads(change(2)), "change_id": "c-bad-name", "type_name": "bad__name"})
    with caplog.at_level("WARNING"):
        await agent._handle(Rec("schema", 0, 1, bad_type, b"w1::object:T"))
        await agent._handle(Rec("schema", 0, 2, bad_name))
        await agent._handle(Rec("schema", 0, 3, b"{not json"))
    got = answers(agent)[1:]
    assert [(a.change_id, a.status, a.reason) for a in got] == [
        ("c2-w1", "refused", "bad-type"), ("c-bad-name", "refused", "bad-name"), ("", "refused", "malformed-json")
    ]  # fmt: skip
    assert got[0].world_id == "w1" and got[0].type_name == "T" and got[0].requested_version == 2
    assert got[0].version == 1 and got[0].world_version == 1  # the branch's, unchanged
    assert "varchar" in (got[0].detail or "")
    assert len(agent._producer.sent["dlq"]) == 3  # type: ignore[union-attr]
    logged = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(logged) == 3 and "bad-type" in logged[0] and "c2-w1" in logged[0]
    assert agent._tracker.committable(("schema", 0)) == 4


async def test_a_world_without_a_branch_leaves_no_series() -> None:
    """Issue 19.7: a change (or an acknowledgement) for world "nosuch" created permanent series."""
    agent, _ = sync(["w1"])
    agent.settings = agent.settings.replace(schema_intelligence_topic="intel")
    await agent._handle(Rec("schema", 0, 0, change(1, world="nosuch")))
    await agent._handle(Rec("schema", 0, 1, change(2, world="nosuch", op="add", id="p", name="x", type="varchar")))
    await agent._handle(Rec("intel", 0, 0, orjson.dumps({"world_id": "nosuch", "version": 3})))
    assert series(agent, "nosuch") == []
    assert "nosuch" not in agent.vectors
    assert [(a.world_id, a.status, a.reason) for a in answers(agent)] == [
        ("nosuch", "refused", "unknown-world"), ("nosuch", "refused", "bad-type")
    ]  # fmt: skip
    reg = agent.metrics.registry
    assert (
        reg.get_sample_value(
            "causeway_schema_changes_total", {"world": "unknown", "outcome": "refused", "reason": "unknown-world"}
        )
        == 1
    )
    assert agent._tracker.committable(("schema", 0)) == 2
