"""Running a rollback: plan against the head, write the restored metadata, one expected-hash commit.

The decisions (which tables, what metadata) are in ``worlds.rollback``; this module reads Nessie
and the warehouse and commits the restored pointers (``sinks.pointers``) through the write path's
commit loop (``sinks.occ.commit_operations``): no retry unless forced, and an unknown outcome is
looked up by the rollback's commit id before anything is tried again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyiceberg.io import load_file_io
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table.metadata import TableMetadataUtil

from sinks.catalog import NessieCatalog
from sinks.errors import BranchMissing, NessieConflict, RetriesExhausted
from sinks.nessie import IcebergTable, Reference
from sinks.occ import Prepared, RetryPolicy, commit_operations
from sinks.pointers import TablePointer, pointer_operations
from sinks.tables import ENTITY_COMMON, ENTITY_EDGE, ENTITY_EVENTS
from worlds.base import WorldsBase
from worlds.errors import InvalidWorldRequest, WorldMoved, WorldNotFound, WorldsError
from worlds.refs import WorldRef
from worlds.rollback import DROP, KEEP, RollbackPlan, plan_actions, restored_metadata, rolled_range

TABLES = (ENTITY_EVENTS, ENTITY_COMMON, ENTITY_EDGE)


@dataclass(frozen=True)
class RollbackOutcome:
    """A rollback's plan and the commit it made (None: the world already was at the target state)."""

    plan: RollbackPlan
    hash: str | None
    attempts: int


class RollbackOps(WorldsBase):
    """The rollback methods of ``worlds.api.Worlds``."""

    # --- 6. rollback -----------------------------------------------------------------------------

    def plan_rollback(
        self, world: str, to: WorldRef | str, *, max_commits: int = 100_000, head: str | None = None
    ) -> RollbackPlan:
        """What ``rollback`` would do now (or at commit ``head`` of the world's branch): the tables to
        restore and the commits it rolls back."""
        head_ref = Reference(self.branch(world), "BRANCH", head) if head else self.head(world)
        target = self.resolve(to)
        if target.ref.world != world:
            raise InvalidWorldRequest(f"the rollback target {target.ref} is not a state of world {world!r}")
        entries = self.client.history_entries(head_ref.name + "@" + head_ref.hash, max_records=200)
        walked = ((e.hash, e.properties) for _, e in zip(range(max_commits + 1), entries, strict=False))
        found = rolled_range(list(walked), target.hash)
        if found is None:
            raise WorldNotFound(
                f"{target.describe()} is not in the history of world {world!r} (within {max_commits:,} commits)"
            )
        hashes, batches = found
        keys = [(self.settings.namespace, t) for t in TABLES]
        at_target = self.client.get_contents(target.pinned, keys)
        at_head = self.client.get_contents(head_ref.pinned, keys)
        actions = plan_actions(TABLES, _locations(at_target), _locations(at_head))
        return RollbackPlan(world, head_ref.name, head_ref.hash, target.hash, actions, hashes, batches)

    def rollback(self, world: str, to: WorldRef | str, *, force: bool = False) -> RollbackOutcome:
        """Commit the target's tables as a new commit on the world's branch, expecting the head planned.

        If the branch moves meanwhile (a worker committed), Nessie refuses the commit and nothing
        changes; with ``force`` the rollback is planned again from each new head, up to the write
        path's retry budget (``commit_retries``): a worker that commits every few tens of
        milliseconds would otherwise win most races against a plan that takes longer. The
        commit goes through the write path's commit loop: an unknown outcome is looked up by the
        rollback's commit id (``causeway.write_id``), so a rollback that landed is never made twice.
        """
        plans: list[RollbackPlan] = []

        def prepare(base: str, n: int) -> Prepared | None:
            plan = self.plan_rollback(world, to, head=base)
            plans.append(plan)
            return None if plan.noop else self._prepare_rollback(plan)

        policy = RetryPolicy(self.settings.commit_retries if force else 0, self.settings.commit_backoff_s)
        try:
            done = commit_operations(
                self.client,
                self.branch(world),
                prepare,
                policy=policy,
                what=f"rollback of world {world}",
                author=self.settings.commit_author,
            )
        except BranchMissing as exc:
            raise WorldNotFound(f"world {world!r} does not exist (no branch {self.branch(world)})") from exc
        except RetriesExhausted as exc:
            if not isinstance(exc.__cause__, NessieConflict):
                raise WorldsError(
                    f"the rollback of world {world!r} has an unknown outcome and was not found in its history: "
                    f"{exc.__cause__}; check `causeway worlds history {world}` before running it again"
                ) from exc
            head = plans[-1].head[:16] if plans else "?"
            raise WorldMoved(
                f"world {world!r} moved during the rollback (head was {head}); nothing changed. "
                "Run it again, or pass --force to plan again from each new head"
            ) from exc
        return RollbackOutcome(plans[-1], done.hash, done.attempts)

    def _prepare_rollback(self, plan: RollbackPlan) -> Prepared:
        """Write the restored metadata files; the pointer operations that publish them, expecting ``plan.head``."""
        ns = self.settings.namespace
        keys = [(ns, t) for t in TABLES]
        head_contents = self.client.get_contents(f"{plan.branch}@{plan.head}", keys)
        now_ms = int(time.time() * 1000)
        puts, deletes, unchanged = [], [], []
        for action in plan.actions:
            key = (ns, action.table)
            if action.action == KEEP:
                if action.head_location is not None:  # a table absent on both sides has no key to check
                    unchanged.append(key)
                continue
            if action.action == DROP:
                deletes.append(key)
                continue
            assert action.target_location is not None
            target_meta = self.metadata(action.target_location)
            head_meta = self.metadata(action.head_location) if action.head_location else None
            new_meta = restored_metadata(target_meta, head_meta, action.head_location, now_ms)
            location = _next_metadata_location(new_meta, action.head_location or action.target_location)
            _write_metadata_json(self.catalog.properties, location, new_meta)
            current = head_contents.get(key)
            puts.append(TablePointer(key, location, new_meta, current.id if current is not None else None))
        ops = pointer_operations(puts=puts, deletes=deletes, unchanged=unchanged)
        return Prepared(ops, plan.message(), plan.properties())


def _locations(contents: Mapping[tuple[str, ...], Any]) -> dict[str, str | None]:
    return {k[-1]: c.metadata_location for k, c in contents.items() if isinstance(c, IcebergTable)}


def _next_metadata_location(metadata: Mapping[str, Any], previous: str) -> str:
    """``<table>/metadata/<version+1>-<uuid>.metadata.json`` after ``previous`` (pyiceberg's naming)."""
    version = NessieCatalog._parse_metadata_version(previous)
    base = str(metadata.get("location", "")).rstrip("/")
    return f"{base}/metadata/{max(version, 0) + 1:05d}-{uuid.uuid4()}.metadata.json"


def _write_metadata_json(properties: Mapping[str, str], location: str, metadata: Mapping[str, Any]) -> None:
    """Validate ``metadata`` as Iceberg table metadata and write it as a new file."""
    parsed = TableMetadataUtil.parse_obj(dict(metadata))
    io = load_file_io(dict(properties), location)
    ToOutputFile.table_metadata(parsed, io.new_output(location))
