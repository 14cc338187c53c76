"""The release RPCs of the world manager service: CreateRelease, ListReleases, DeleteRelease.

They call ``worlds.api.Worlds``'s release methods (``worlds.releases``) in a worker thread through
the servicer's one path (auth, idempotency key, audit log). Releases are immutable Nessie tags
``release/WORLD/NAME``; deleting one is admin-only and answers ``deleted=false`` when there is none,
so a retry after a crash that deleted it is no error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from api import paging
from api import world_manager_pb2 as pb
from sinks.errors import NessieNotFound
from worlds.api import Worlds, WorldsError


def release_message(r: Any) -> pb.Release:
    return pb.Release(
        world_id=r.world,
        name=r.name,
        tag=r.tag,
        hash=r.hash,
        released_hash=r.released_hash,
        message=r.message,
        created_at=r.created_at.isoformat() if r.created_at else "",
    )


class ReleaseRpcs:
    """Mixin of :class:`api.service.WorldService`: the release RPCs."""

    if TYPE_CHECKING:
        from models.worlds import WorldNaming

        naming: WorldNaming
        _write: Callable[..., Awaitable[Any]]
        _read: Callable[..., Awaitable[Any]]
        _blocking: Callable[[Callable[[Worlds], Any]], Awaitable[Any]]

    async def CreateRelease(self, request: pb.CreateReleaseRequest, context: Any) -> pb.ReleaseResponse:  # noqa: N802
        async def act() -> pb.ReleaseResponse:
            release, created = await self._blocking(
                lambda w: w.create_release(request.world_id, request.release_name, request.description)
            )
            return pb.ReleaseResponse(release=release_message(release), created=created)

        return await self._write("CreateRelease", request.world_id, request, context, pb.ReleaseResponse, act)

    async def ListReleases(self, request: pb.ListReleasesRequest, context: Any) -> pb.ListReleasesResponse:  # noqa: N802
        async def act() -> pb.ListReleasesResponse:
            size = paging.page_size(request.page_size)
            state = paging.decode(request.page_token, "releases") or {}
            if request.world_id:
                self.naming.branch(request.world_id)
            found = await self._blocking(lambda w: w.list_releases(request.world_id or None))
            ordered = sorted(found, key=lambda r: r.tag)
            rest = paging.after(ordered, lambda r: r.tag, state.get("after"))
            page = rest[:size]
            token = paging.encode("releases", after=page[-1].tag) if len(rest) > size else ""
            return pb.ListReleasesResponse(releases=[release_message(r) for r in page], next_page_token=token)

        return await self._read("ListReleases", request.world_id or None, context, act)

    async def DeleteRelease(self, request: pb.DeleteReleaseRequest, context: Any) -> pb.DeleteReleaseResponse:  # noqa: N802
        """Admin only. A release that does not exist answers ``deleted=false`` (a retry after a crash
        that deleted it finds it gone); the tag is deleted at the hash just read (Nessie refuses otherwise)."""

        def act_blocking(w: Worlds) -> pb.DeleteReleaseResponse:
            try:
                release = w.delete_release(request.world_id, request.release_name)
            except WorldsError as exc:
                if "does not exist" not in str(exc):
                    raise
                return pb.DeleteReleaseResponse(deleted=False)
            except NessieNotFound:  # deleted by a concurrent call between the read and the delete
                return pb.DeleteReleaseResponse(deleted=False)
            return pb.DeleteReleaseResponse(release=release_message(release), deleted=True)

        async def act() -> pb.DeleteReleaseResponse:
            return await self._blocking(act_blocking)

        return await self._write("DeleteRelease", request.world_id, request, context, pb.DeleteReleaseResponse, act)
