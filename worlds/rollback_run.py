"""Running a rollback: plan against the head, write the restored metadata, one expected-hash commit.

The decisions (which tables, what metadata) are in ``worlds.rollback``; this module reads Nessie
and the warehouse and commits through ``sinks.pointers``.
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
from sinks.errors import NessieConflict
from sinks.nessie import CommitResult, IcebergTable
from sinks.pointers import TablePointer, commit_pointers
from sinks.tables import ENTITY_COMMON, ENTITY_EDGE, ENTITY_EVENTS
from worlds.base import WorldsBase
from worlds.errors import WorldsError
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

    def plan_rollback(self, world: str, to: WorldRef | str, *, max_commits: int = 100_000) -> RollbackPlan:
        """What ``rollback`` would do now: the tables to restore and the commits it rolls back."""
        head = self.head(world)
        target = self.resolve(to)
        if target.ref.world != world:
            raise WorldsError(f"the rollback target {target.ref} is not a state of world {world!r}")
        entries = self.client.history_entries(head.name + "@" + head.hash, max_records=200)
        walked = ((e.hash, e.properties) for _, e in zip(range(max_commits + 1), entries, strict=False))
        found = rolled_range(list(walked), target.hash)
        if found is None:
            raise WorldsError(
                f"{target.describe()} is not in the history of world {world!r} (within {max_commits:,} commits)"
            )
        hashes, batches = found
        keys = [(self.settings.namespace, t) for t in TABLES]
        at_target = self.client.get_contents(target.pinned, keys)
        at_head = self.client.get_contents(head.pinned, keys)
        actions = plan_actions(TABLES, _locations(at_target), _locations(at_head))
        return RollbackPlan(world, head.name, head.hash, target.hash, actions, hashes, batches)

    def rollback(self, world: str, to: WorldRef | str, *, force: bool = False) -> RollbackOutcome:
        """Commit the target's tables as a new commit on the world's branch, expecting the head planned.

        If the branch moves meanwhile (a worker committed), Nessie refuses the commit and nothing
        changes; with ``force`` the rollback is planned and tried once more from the new head.
        """
        for attempt in (1, 2):
            plan = self.plan_rollback(world, to)
            if plan.noop:
                return RollbackOutcome(plan, None, attempt)
            try:
                result = self._commit_rollback(plan)
            except NessieConflict as exc:
                if force and attempt == 1:
                    continue
                raise WorldsError(
                    f"world {world!r} moved during the rollback (head was {plan.head[:16]}); nothing changed. "
                    "Run it again, or pass --force to retry once from the new head"
                ) from exc
            return RollbackOutcome(plan, result.hash, attempt)
        raise AssertionError("unreachable")

    def _commit_rollback(self, plan: RollbackPlan) -> CommitResult:
        ns = self.settings.namespace
        keys = [(ns, t) for t in TABLES]
        head_contents = self.client.get_contents(f"{plan.branch}@{plan.head}", keys)
        now_ms = int(time.time() * 1000)
        puts, deletes, unchanged = [], [], []
        for action in plan.actions:
            key = (ns, action.table)
            if action.action == KEEP:
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
        return commit_pointers(
            self.client,
            plan.branch,
            plan.head,
            puts=puts,
            deletes=deletes,
            unchanged=unchanged,
            message=plan.message(),
            author=self.settings.commit_author,
            properties=plan.properties(),
        )


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
