"""The CLI's world commands over the API: the ``WorldManager`` interface, backed by ``api.client``.

``cli.worlds`` uses it when ``CAUSEWAY_API_URL`` is set, so operators go through the API's
authentication, roles, idempotency and audit log instead of writing Nessie directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Self, TypeVar

import grpc

from api.client import WorldClient
from api.world_manager_pb2 import World as PbWorld
from api.world_manager_pb2 import WorldResponse
from sinks.nessie import Reference
from streams.settings import Settings
from worlds.errors import WorldsError
from worlds.manager import ForkSource, InvalidWorld, World, WorldError
from worlds.refs import parse_release_tag

T = TypeVar("T")


def _world(w: PbWorld) -> World:
    return World(w.world_id, w.branch, w.head_hash)


def _error(exc: grpc.RpcError) -> WorldError:
    return WorldError(f"API {exc.code().name}: {exc.details()}")


class Remote:
    """A client of the API held for one CLI command (``with Remote.from_settings(s) as r: ...``)."""

    def __init__(self, client: WorldClient) -> None:
        self.client = client

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(WorldClient.from_settings(settings))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()``; a gRPC error becomes a ``WorldsError`` naming the status: one error line in the CLI."""
        try:
            return fn()
        except grpc.RpcError as exc:
            raise WorldsError(f"API {exc.code().name}: {exc.details()}") from exc


class RemoteWorldManager(Remote):
    async def get(self, world_id: str) -> World | None:
        try:
            return _world(self.client.get_world(world_id))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise _error(exc) from exc

    async def list(self) -> list[World]:
        try:
            return [_world(w) for w in self.client.list_worlds()]
        except grpc.RpcError as exc:
            raise _error(exc) from exc

    def _fork(self, world_id: str, source: ForkSource, *, dry_run: bool = False) -> WorldResponse:
        try:
            if source.commit:
                return self.client.fork_world("", world_id, commit=source.commit, dry_run=dry_run)
            if source.tag:
                parsed = parse_release_tag(source.tag)
                if parsed is None:
                    raise InvalidWorld(
                        f"over the API --from-tag takes a release tag release/WORLD/NAME, not {source.tag!r}"
                    )
                return self.client.fork_world(parsed[0], world_id, release=parsed[1], dry_run=dry_run)
            if source.world or dry_run:
                return self.client.fork_world(source.world or "", world_id, dry_run=dry_run)
            return self.client.create_world(world_id)
        except grpc.RpcError as exc:
            raise _error(exc) from exc

    async def create(self, world_id: str, source: ForkSource | None = None) -> tuple[World, bool]:
        answer = self._fork(world_id, source or ForkSource())
        return _world(answer.world), answer.created

    async def plan_create(self, world_id: str, source: ForkSource | None = None) -> tuple[World | None, Reference]:
        """What ``create`` would do (ForkWorld with ``dry_run``): (the existing world or None, the fork point)."""
        answer = self._fork(world_id, source or ForkSource(), dry_run=True)
        w = _world(answer.world)
        return (None if answer.created else w), Reference(w.branch, "BRANCH", w.hash)

    async def plan_delete(self, world_id: str) -> World | None:
        """The world ``delete`` would remove (None if absent); the server refuses prod on the delete itself."""
        return await self.get(world_id)

    async def delete(self, world_id: str, expected_hash: str | None = None) -> bool:
        try:
            return self.client.delete_world(world_id, expected_hash=expected_hash or "")
        except grpc.RpcError as exc:
            raise _error(exc) from exc
