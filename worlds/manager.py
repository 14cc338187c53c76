"""Worlds as Nessie branches: create, fork, list, delete.

A world exists exactly when its branch exists; there is no second registry to drift from Nessie.
Creating a world that exists is not an error when it already points where asked (safe to run twice).
"""

from __future__ import annotations

from dataclasses import dataclass

from models.errors import WorldsError
from models.worlds import WorldNaming, validate_world_id
from sinks.errors import NessieConflict, NessieNotFound
from sinks.nessie import NessieClient, Reference
from worlds.errors import InvalidWorldRequest, WorldMoved, WorldNotFound


class WorldError(WorldsError):
    """A world operation that cannot be done; the message says why and what to do."""


class ForkSourceNotFound(WorldError, WorldNotFound):
    """The branch, tag or commit a new world was to fork from does not exist."""


class InvalidWorld(WorldError, InvalidWorldRequest):
    """A world request that is wrong as asked (a fork source of the wrong form)."""


class DeleteMoved(WorldError, WorldMoved):
    """The world moved while it was being deleted; nothing was deleted."""


@dataclass(frozen=True)
class World:
    world_id: str
    branch: str
    hash: str


@dataclass(frozen=True)
class ForkSource:
    """Where a new world starts: another world's head, a tag, or a commit hash (on ``on_branch``)."""

    world: str | None = None
    tag: str | None = None
    commit: str | None = None

    def describe(self) -> str:
        if self.tag:
            return f"tag {self.tag}"
        if self.commit:
            return f"commit {self.commit[:12]}"
        return f"world {self.world or 'prod'}"


class WorldManager:
    def __init__(self, nessie: NessieClient, naming: WorldNaming) -> None:
        self.nessie = nessie
        self.naming = naming

    async def get(self, world_id: str) -> World | None:
        branch = self.naming.branch(world_id)
        try:
            ref = await self.nessie.get_reference(branch)
        except NessieNotFound:
            return None
        return World(world_id, branch, ref.hash)

    async def list(self) -> list[World]:
        out = []
        for ref in await self.nessie.list_references():
            if ref.type != "BRANCH":
                continue
            world = self.naming.world(ref.name)
            if world is not None:
                out.append(World(world, ref.name, ref.hash))
        return sorted(out, key=lambda w: w.world_id)

    async def _resolve(self, source: ForkSource) -> Reference:
        try:
            if source.tag:
                return await self.nessie.get_reference(source.tag)
            if source.commit:
                # Nessie needs a named reference to create from; the hash decides the content.
                main = await self.nessie.get_reference(self.naming.main_branch)
                at = Reference(main.name, "BRANCH", source.commit)
                async for _ in self.nessie.history(at.pinned, max_records=1):
                    break  # the commit exists (Nessie answers 404 otherwise)
                return at
            src_world = source.world or self.naming.prod_world
            return await self.nessie.get_reference(self.naming.branch(src_world))
        except NessieNotFound as exc:
            hint = " (give the full 64-hex hash)" if source.commit and len(source.commit) < 64 else ""
            raise ForkSourceNotFound(f"fork source {source.describe()} does not exist{hint}") from exc

    async def plan_create(self, world_id: str, source: ForkSource | None = None) -> tuple[World | None, Reference]:
        """Every check ``create`` makes, changing nothing: (the existing world or None, the fork point).

        Raises WorldError when the fork source (world, tag or commit) does not exist."""
        validate_world_id(world_id)
        existing = await self.get(world_id)
        ref = await self._resolve(source or ForkSource())
        return existing, ref

    async def create(self, world_id: str, source: ForkSource | None = None) -> tuple[World, bool]:
        """Create (fork) a world; returns (world, created). Idempotent when it already exists."""
        validate_world_id(world_id)
        source = source or ForkSource()
        existing = await self.get(world_id)
        if existing is not None:
            return existing, False
        ref = await self._resolve(source)
        branch = self.naming.branch(world_id)
        try:
            created = await self.nessie.create_branch(branch, ref)
        except NessieConflict:
            # Another worker created it between our check and our create: same outcome.
            again = await self.get(world_id)
            if again is None:
                raise
            return again, False
        except NessieNotFound as exc:
            raise ForkSourceNotFound(f"fork source {source.describe()} does not exist") from exc
        return World(world_id, branch, created.hash), True

    async def plan_delete(self, world_id: str) -> World | None:
        """Every check ``delete`` makes, changing nothing: the world to delete, or None if absent.

        Raises WorldError for the production world (it is never deleted)."""
        if world_id == self.naming.prod_world:
            raise WorldError(
                f"world {world_id!r} is the production world ({self.naming.main_branch}); it cannot be deleted"
            )
        return await self.get(world_id)

    async def delete(self, world_id: str, expected_hash: str | None = None) -> bool:
        """Delete a world's branch; False if it did not exist. Refuses the production world."""
        world = await self.plan_delete(world_id)
        if world is None:
            return False
        try:
            await self.nessie.delete_reference(world.branch, expected_hash or world.hash, "BRANCH")
        except NessieConflict as exc:
            raise DeleteMoved(
                f"world {world_id!r} moved while deleting (now past {world.hash[:12]}); check its history and retry"
            ) from exc
        return True


def world_ids(refs: list[Reference], naming: WorldNaming) -> list[str]:
    """The worlds among ``refs`` (branches whose name maps back to a world id), sorted."""
    return sorted(w for ref in refs if ref.type.upper() == "BRANCH" and (w := naming.world(ref.name)) is not None)
