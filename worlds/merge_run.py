"""The write half of a merge: plan against the target's head, commit once, retry on a moved head.

One attempt: pin the target head ``H`` and the source head, find the base, read both sides' changed
keys (``worlds.merge_read``), decide (``worlds.merge.merge``), and turn every write into a change
event on the target (new event id, ``caused_by`` = the source event, ``source`` =
``merge:<source>@<hash>``, version = one above the highest the key has on base, source and target,
so versions stay monotonic per entity). The events go through the batch committer, which appends
them to ``entity_events`` and applies them to ``entity_common`` / ``entity_edge`` in **one** Nessie
commit expecting ``H`` (the committer's own retry is off: a hook refuses to publish when its pinned
head is not ``H``). If the target moved, the whole plan is computed again against the new head, up
to ``retries`` times; nothing is ever overwritten. The commit's properties record the merge point
(``causeway.merge.source``, ``.source_hash``, ``.base``, ``.target_head``) for the next base.

A dry run is the same plan without the commit: same conflicts, same counts, nothing written.
MANUAL merges that meet conflicts are stored as a pending merge (a JSON file per target world
under ``<data_dir>/merges/``) with the heads they were planned against; ``resolve`` records a
choice per conflict and ``continue`` plans again with the choices (refusing if either head moved),
then commits.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.catalog import NessieCatalog
from sinks.committer import Batch, BatchCommitter
from sinks.errors import NessieConflict, RetriesExhausted
from worlds.base import WorldsBase
from worlds.merge import (
    Conflict,
    ConflictType,
    InvalidMerge,
    Key,
    MergeError,
    MergeMoved,
    MergeNotFound,
    MergeResult,
    Resolve,
    State,
    Strategies,
    merge,
    schema_conflicts,
)
from worlds.merge_read import (
    PROJECTIONS,
    PROP_MERGE_BASE,
    PROP_MERGE_SOURCE,
    PROP_MERGE_SOURCE_HASH,
    PROP_MERGE_TARGET_HEAD,
    find_base,
    side_changes,
)


@dataclass
class MergeOutcome:
    """What a merge did (or, for a dry run, would do)."""

    source: str
    target: str
    source_hash: str
    target_head: str
    base: str
    strategies: Strategies
    result: MergeResult
    schema: list[dict[str, str]] = field(default_factory=list)
    dry_run: bool = False
    committed: str | None = None  # the merge commit's hash
    status: str = "planned"  # planned | merged | nothing-to-merge | conflicts | pending
    attempts: int = 1
    seconds: float = 0.0
    read: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "source": self.source,
            "target": self.target,
            "source_hash": self.source_hash,
            "target_head": self.target_head,
            "base": self.base,
            "strategy": self.strategies.to_json(),
            "dry_run": self.dry_run,
            "commit": self.committed,
            "attempts": self.attempts,
            "seconds": round(self.seconds, 3),
            **self.result.summary(),
            "schema_conflicts": self.schema,
            "conflict_list": [c.to_json() for c in self.result.conflicts],
            "read": self.read,
        }


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def merge_events(
    result: MergeResult, target_world: str, source_world: str, source_hash: str, merge_id: str
) -> list[ChangeEvent]:
    """One change event per write of the merge result (pure)."""
    out: list[ChangeEvent] = []
    now = _now_ms()
    src = f"merge:{source_world}@{source_hash}"
    for r in result.writes.to_pylist():
        versions = [v for v in (r["b_version"], r["s_version"], r["t_version"], r["r_version"]) if v is not None]
        version = max(versions, default=0) + 1
        live = bool(r["r_live"])
        if not live:
            change = ChangeType.DELETE
        else:
            change = ChangeType.UPDATE if r["t_live"] else ChangeType.CREATE
        digest = hashlib.sha1(f"{r['kind']}\x1f{r['type']}\x1f{r['pk']}".encode()).hexdigest()[:20]
        out.append(
            ChangeEvent(
                event_id=f"merge-{merge_id}-{digest}",
                world_id=target_world,
                kind=EntityKind(r["kind"]),
                entity_type=r["type"],
                entity_pk=r["pk"],
                change_type=change,
                version=version,
                before=None,
                after=orjson.loads(r["r_props"]) if live and r["r_props"] else ({} if live else None),
                caused_by=r["cause"],
                causal_order=None,
                occurred_at_ms=r["r_ts"] if r["r_ts"] is not None else now,
                schema_version=0,
                source=src,
                from_pk=r["r_from"] if r["kind"] == "link" else None,
                to_pk=r["r_to"] if r["kind"] == "link" else None,
            )
        )
    return out


class MergeOps(WorldsBase):
    """Merges worlds (see the module doc). ``retries``: recomputations on a moved target head."""

    retries = 5

    # --- planning ----------------------------------------------------------------------------------

    def plan_merge(
        self,
        source: str,
        target: str,
        strategies: Strategies,
        *,
        resolutions: Mapping[tuple[Key, str], State | str] | None = None,
        at: tuple[str, str] | None = None,
    ) -> MergeOutcome:
        """Decide the merge of ``source`` into ``target`` at their heads (or at ``at`` = hashes)."""
        if source == target:
            raise InvalidMerge("source and target are the same world")
        sb, tb = self.branch(source), self.branch(target)
        s_hash = at[0] if at else self.head(source).hash
        t_hash = at[1] if at else self.head(target).hash
        found = find_base(
            _entries(self.client, f"{sb}@{s_hash}"), _entries(self.client, f"{tb}@{t_hash}"), source, target
        )
        if found is None:
            raise MergeError(f"worlds {source} and {target} share no history: no merge base")
        base_hash, on = found
        base_ref = f"{sb if on == 'source' else tb}@{base_hash}"
        names = [name for name, *_ in PROJECTIONS]
        base_t = {n: self.table(base_ref, n) for n in names}
        src_t = {n: self.table(f"{sb}@{s_hash}", n) for n in names}
        tgt_t = {n: self.table(f"{tb}@{t_hash}", n) for n in names}
        schema = []
        for n in names:
            for c in schema_conflicts(
                n, *(tbl.schema() if (tbl := t[n]) is not None else None for t in (base_t, src_t, tgt_t))
            ):
                schema.append({"table": c.table, "column": c.column, "detail": c.detail})
        s_changes = side_changes(base_t, src_t, "s_")
        t_changes = side_changes(base_t, tgt_t, "t_")
        result = merge(s_changes.table("s_"), t_changes.table("t_"), strategies, resolutions)
        read = {"source": s_changes.stats(), "target": t_changes.stats()}
        return MergeOutcome(source, target, s_hash, t_hash, base_hash, strategies, result, schema, read=read)

    # --- merging -----------------------------------------------------------------------------------

    def merge_worlds(
        self,
        source: str,
        into: str,
        strategy: str | Strategies = "NORMAL",
        *,
        strategy_for: Mapping[str, str] | None = None,
        dry_run: bool = False,
        message: str | None = None,
    ) -> MergeOutcome:
        """Merge world ``source`` into world ``into`` (the Python API of ``causeway worlds merge``).

        ``strategy``: NORMAL, OURS/TARGET_WINS, THEIRS/SOURCE_WINS, FIELD_LEVEL[+S], TIMESTAMP_WINS or
        MANUAL; ``strategy_for``: ``{entity_type: strategy}`` overrides. Returns a :class:`MergeOutcome`
        whose ``status`` is ``merged`` (``committed`` = the commit hash), ``nothing-to-merge``,
        ``conflicts`` (NORMAL met conflicts: nothing written), ``pending`` (MANUAL: conflicts stored,
        see ``resolve_conflict`` / ``continue_merge`` / ``abort_merge``) or ``planned`` (dry run).
        Raises :class:`worlds.merge.MergeError` (a ``WorldsError``) for bad input or a target that
        kept moving.
        """
        if isinstance(strategy, str):
            strategy = Strategies.parse(strategy, [f"{k}={v}" for k, v in (strategy_for or {}).items()])
        return self._merge(source, into, strategy, dry_run=dry_run, message=message)

    def _merge(
        self,
        source: str,
        target: str,
        strategies: Strategies,
        *,
        dry_run: bool = False,
        message: str | None = None,
        resolutions: Mapping[tuple[Key, str], State | str] | None = None,
        at: tuple[str, str] | None = None,
    ) -> MergeOutcome:
        started = time.monotonic()
        for attempt in range(1, self.retries + 2):
            out = self.plan_merge(source, target, strategies, resolutions=resolutions, at=at)
            out.attempts, out.dry_run = attempt, dry_run
            if out.schema:
                out.status = "conflicts"
            elif out.result.conflicts:
                manual = any(strategies.for_type(c.entity_type).resolve is Resolve.MANUAL for c in out.result.conflicts)
                out.status = "pending" if manual else "conflicts"
                if manual and not dry_run:
                    self.pending_store().save(out)
            elif out.result.writes.num_rows == 0:
                out.status = "nothing-to-merge"
            else:
                out.status = "planned"
            if dry_run or out.status != "planned":
                out.seconds = time.monotonic() - started
                return out
            try:
                out.committed = self._commit(out, message)
                out.status = "merged"
                out.seconds = time.monotonic() - started
                return out
            except NessieConflict:
                if at is not None:
                    raise MergeMoved(
                        f"world {target} moved since the pending merge was planned; run the merge again"
                    ) from None
                continue
        raise MergeMoved(f"world {target} kept moving: gave up after {self.retries + 1} attempts")

    def _commit(self, out: MergeOutcome, message: str | None) -> str:
        merge_id = hashlib.sha1(f"{out.source_hash}:{out.target_head}".encode()).hexdigest()[:12]
        events = merge_events(out.result, out.target, out.source, out.source_hash, merge_id)
        props = {
            PROP_MERGE_SOURCE: out.source,
            PROP_MERGE_SOURCE_HASH: out.source_hash,
            PROP_MERGE_BASE: out.base,
            PROP_MERGE_TARGET_HEAD: out.target_head,
            "causeway.merge.strategy": str(out.strategies.default),
        }
        text = message or f"merge world {out.source}@{out.source_hash[:16]} into {out.target}"
        expected = out.target_head

        touched = _touched(out.result)

        def check(cat: NessieCatalog, batch: Batch, attempt: int) -> None:
            # The committer pinned the head it commits against; if a writer moved the target since
            # the plan, the plan still holds only when the writer touched none of the merge's keys
            # (nor an endpoint of a merged link, nor a link to a deleted object): read just that.
            if cat.base_hash != expected and not self._disjoint(out.target, expected, str(cat.base_hash), touched):
                raise NessieConflict(f"target moved from {expected[:16]} to {cat.base_hash} over merged keys")

        committer = _MergeCommitter(self.settings, self.client, before_publish=check, message=text, extra=props)
        batch = Batch(out.target, f"merge-{merge_id}", events)
        try:
            outcome = committer.commit_batch(batch)
        except RetriesExhausted as exc:
            raise NessieConflict(str(exc)) from exc
        return outcome.hash

    def _disjoint(
        self, target: str, planned: str, now: str, touched: tuple[set[tuple[str, str, str]], set[str], set[str]]
    ) -> bool:
        """Whether the commits between ``planned`` and ``now`` left the merge's keys alone."""
        branch = self.branch(target)
        names = [name for name, *_ in PROJECTIONS]
        moved = side_changes(
            {n: self.table(f"{branch}@{planned}", n) for n in names},
            {n: self.table(f"{branch}@{now}", n) for n in names},
            "t_",
        ).table("t_")
        keys, ends, gone = touched
        for r in moved.select(["kind", "type", "pk", "t_live", "t_from", "t_to"]).to_pylist():
            if (r["kind"], r["type"], r["pk"]) in keys:
                return False
            if r["kind"] == "object" and r["pk"] in ends:
                return False
            if r["kind"] == "link" and r["t_live"] and ({r["t_from"], r["t_to"]} & gone):
                return False
        return True

    # --- MANUAL ------------------------------------------------------------------------------------

    def pending_merge(self, target: str) -> dict[str, Any]:
        """The pending MANUAL merge into ``target``: conflicts (with ids) and the choices made."""
        return self.pending_store().load(target)

    def resolve_conflict(self, target: str, conflict_id: int, take: str) -> dict[str, Any]:
        """Choose ``source``, ``target`` or ``value=JSON`` for one conflict of the pending merge."""
        return self.pending_store().resolve(target, conflict_id, take)

    def abort_merge(self, target: str) -> None:
        """Drop the pending merge into ``target`` (nothing was written to the world)."""
        self.pending_store().drop(target)

    def pending_store(self) -> PendingStore:
        return PendingStore(Path(self.settings.data_dir) / "merges")

    def continue_merge(self, target: str, *, message: str | None = None) -> MergeOutcome:
        pending = self.pending_store().load(target)
        out = self._merge(
            pending["source"],
            target,
            Strategies.from_json(pending["strategy"]),
            message=message,
            resolutions=PendingStore.resolutions(pending),
            at=(pending["source_hash"], pending["target_head"]),
        )
        if out.status == "merged":
            self.pending_store().drop(target)
        return out


def _touched(result: MergeResult) -> tuple[set[tuple[str, str, str]], set[str], set[str]]:
    """Keys the merge writes, object pks its live links point at, and object pks it deletes."""
    keys: set[tuple[str, str, str]] = set()
    ends: set[str] = set()
    gone: set[str] = set()
    for r in result.writes.select(["kind", "type", "pk", "r_live", "r_from", "r_to"]).to_pylist():
        keys.add((r["kind"], r["type"], r["pk"]))
        if r["kind"] == "link" and r["r_live"]:
            ends |= {e for e in (r["r_from"], r["r_to"]) if e is not None}
        if r["kind"] == "object" and not r["r_live"]:
            gone.add(r["pk"])
    return keys, ends, gone


class _MergeCommitter(BatchCommitter):
    """The batch committer with the merge's commit message and merge-point properties."""

    def __init__(self, *args: Any, message: str, extra: Mapping[str, str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._message, self._extra = message, dict(extra)

    def _publish(self, cat: NessieCatalog, message: str, properties: dict[str, str]) -> str:
        return super()._publish(cat, self._message, {**properties, **self._extra})


def _entries(client: Any, ref: str) -> Any:
    for page in client.history(ref, max_records=500):
        yield from page


# --- pending MANUAL merges ---------------------------------------------------------------------------


class PendingStore:
    """Pending MANUAL merges, one JSON file per target world (written atomically)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, target: str) -> Path:
        return self.root / f"{target}.json"

    def save(self, out: MergeOutcome) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        doc = {
            "source": out.source,
            "target": out.target,
            "source_hash": out.source_hash,
            "target_head": out.target_head,
            "base": out.base,
            "strategy": out.strategies.to_json(),
            "created": datetime.now(UTC).isoformat(),
            "conflicts": [{"id": i + 1, **c.to_json()} for i, c in enumerate(out.result.conflicts)],
            "resolutions": {},
        }
        old = self.path(out.target)
        if old.exists():  # keep choices already made for conflicts that are still there
            prev = orjson.loads(old.read_bytes())
            if prev.get("source") == out.source:
                doc["resolutions"] = prev.get("resolutions", {})
        self._write(out.target, doc)

    def _write(self, target: str, doc: dict[str, Any]) -> None:
        tmp = self.path(target).with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.path(target))

    def load(self, target: str) -> dict[str, Any]:
        p = self.path(target)
        if not p.exists():
            raise MergeNotFound(f"no pending merge into {target}")
        return orjson.loads(p.read_bytes())

    def drop(self, target: str) -> None:
        self.load(target)
        self.path(target).unlink()

    def resolve(self, target: str, conflict_id: int, take: str) -> dict[str, Any]:
        """Record ``take`` (``source``, ``target`` or ``value=JSON``) for one conflict."""
        doc = self.load(target)
        found = [c for c in doc["conflicts"] if c["id"] == conflict_id]
        if not found:
            raise MergeNotFound(f"no conflict {conflict_id} in the pending merge into {target}")
        if take not in ("source", "target"):
            if not take.startswith("value="):
                raise InvalidMerge("--take wants source, target or value=JSON")
            try:
                value = orjson.loads(take[len("value=") :])
            except orjson.JSONDecodeError as exc:
                raise InvalidMerge(f"value is not JSON: {exc}") from None
            if value is not None and not isinstance(value, dict):
                raise InvalidMerge("value must be a JSON object of properties (or null to delete)")
        c = found[0]
        doc["resolutions"][_rkey(c)] = take
        self._write(target, doc)
        return c

    @staticmethod
    def resolutions(doc: Mapping[str, Any]) -> dict[tuple[Key, str], State | str]:
        by_key = {_rkey(c): c for c in doc["conflicts"]}
        out: dict[tuple[Key, str], State | str] = {}
        for k, take in doc.get("resolutions", {}).items():
            c = by_key.get(k)
            if c is None:
                continue
            key = (c["kind"], c["type"], c["pk"])
            if take.startswith("value="):
                value = orjson.loads(take[len("value=") :])
                ends = c.get("source") or c.get("target") or {}
                out[(key, c["conflict"])] = State(value, ends.get("from_pk"), ends.get("to_pk"))
            else:
                out[(key, c["conflict"])] = take
        return out


def _rkey(c: Mapping[str, Any]) -> str:
    return f"{c['kind']}/{c['type']}/{c['pk']}/{c['conflict']}"


__all__ = ["Conflict", "ConflictType", "MergeOps", "MergeOutcome", "PendingStore", "merge_events"]
