"""Releases: immutable, named states of a world, kept as Nessie tags ``release/WORLD/NAME``.

A release is recorded on the world's branch by a commit that touches no table (an UNCHANGED
operation on a key no table uses, so it never conflicts with a writer), made through the write
path's commit loop (``sinks.occ.commit_operations``), then tagged. Nessie lets a
tag be reassigned; causeway never does: creating an existing name at another state is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from models.worlds import InvalidWorldId
from sinks.errors import BranchMissing, NessieNotFound, NessieReferenceAlreadyExists
from sinks.nessie import Namespace, Operation, Reference
from sinks.occ import Committed, Prepared, RetryPolicy, commit_operations
from worlds import history as hist
from worlds.base import WorldsBase
from worlds.errors import InvalidWorldRequest, WorldExists, WorldNotFound, WorldsError
from worlds.refs import InvalidRef, parse_release_tag, release_tag

#: The key a release commit marks as UNCHANGED in a world that has no namespace yet.
RELEASE_MARKER_KEY = ("causeway_releases",)


@dataclass(frozen=True)
class Release:
    world: str
    name: str
    tag: str
    hash: str
    released_hash: str
    message: str
    created_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "world": self.world,
            "name": self.name,
            "tag": self.tag,
            "hash": self.hash,
            "released_hash": self.released_hash,
            "message": self.message,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }


class ReleaseOps(WorldsBase):
    """The release methods of ``worlds.api.Worlds``."""

    # --- 3. releases -----------------------------------------------------------------------------

    def create_release(self, world: str, name: str, message: str = "") -> tuple[Release, bool]:
        """Tag the world's head as release ``name``; returns (release, created).

        A release is immutable: creating an existing name again is a no-op when it already holds the
        world's current state, and refused otherwise (Nessie would let a tag move; causeway does not).
        The release is recorded on the world's branch as a commit that touches no table.
        """
        tag = self._release_tag(world, name)
        head = self.head(world)
        existing = self._get_tag(tag)
        if existing is not None:
            release = self._release(tag, existing.hash)
            if head.hash in (release.hash, release.released_hash):
                return release, False
            raise WorldExists(
                f"release {world}/{name} exists at {release.released_hash[:16]}; releases are immutable "
                f"(the world is now at {head.hash[:16]}): pick another name"
            )
        # The released state is the release commit's parent: if a writer committed since the head was
        # read, Nessie rebases this table-less commit onto it, and the tag holds that newer state.
        props = {hist.PROP_RELEASE: name, "causeway.world": world}
        if message:
            props["causeway.release.message"] = message
        marker = self._release_commit(world, name, message, props, head)
        assert marker.hash is not None  # a release always commits
        try:
            self.client.create_tag(tag, Reference(head.name, "BRANCH", marker.hash))
        except NessieReferenceAlreadyExists as exc:
            raise WorldsError(f"release {world}/{name} was created concurrently; run `release show`") from exc
        return self._release(tag, marker.hash), True

    def _release_commit(self, world: str, name: str, message: str, props: dict[str, str], head: Reference) -> Committed:
        """The table-less commit that records a release, through the write path's commit loop.

        Its one operation is UNCHANGED on the namespace (or, in a world without tables, on a key no
        table uses): Nessie rebases it over any writer's commit, but refuses a rebase over a key that
        does not exist, hence the retries from a fresh head (jittered backoff, ``CAUSEWAY_COMMIT_RETRIES``);
        an unknown outcome is looked up by the commit's ``causeway.write_id``. Raises RetriesExhausted
        (a NessieConflict) when every attempt was refused.
        """
        ns = (self.settings.namespace,)
        text = f"release {name} of world {world}" + (f": {message}" if message else "")

        def prepare(base: str, n: int) -> Prepared:
            at = f"{head.name}@{base}"
            key = ns if isinstance(self.client.get_contents(at, [ns]).get(ns), Namespace) else RELEASE_MARKER_KEY
            return Prepared([Operation("UNCHANGED", key)], text, props)

        policy = RetryPolicy(self.settings.commit_retries, self.settings.commit_backoff_s)
        try:
            return commit_operations(
                self.client, head.name, prepare, policy=policy, what=text, author=self.settings.commit_author
            )
        except BranchMissing as exc:
            raise WorldNotFound(f"world {world!r} does not exist (no branch {head.name})") from exc

    def list_releases(self, world: str | None = None) -> list[Release]:
        out = []
        for ref in self.client.list_references():
            parsed = parse_release_tag(ref.name) if ref.type == "TAG" else None
            if parsed and (world is None or parsed[0] == world):
                out.append(self._release(ref.name, ref.hash))
        return sorted(out, key=lambda r: (r.world, r.created_at or datetime.min, r.name))

    def get_release(self, world: str, name: str) -> Release:
        tag = self._release_tag(world, name)
        found = self._get_tag(tag)
        if found is None:
            raise WorldNotFound(f"release {world}/{name} does not exist")
        return self._release(tag, found.hash)

    def delete_release(self, world: str, name: str) -> Release:
        release = self.get_release(world, name)
        self.client.delete_reference(release.tag, release.hash, "TAG")
        return release

    def _release_tag(self, world: str, name: str) -> str:
        try:
            self.branch(world)
            return release_tag(world, name)
        except (InvalidRef, InvalidWorldId) as exc:
            raise InvalidWorldRequest(str(exc)) from exc

    def _get_tag(self, tag: str) -> Reference | None:
        try:
            return self.client.get_reference(tag)
        except NessieNotFound:
            return None

    def _release(self, tag: str, hash: str) -> Release:
        world, name = parse_release_tag(tag) or ("?", tag)
        entry = self._first(f"{tag}@{hash}")
        props = entry.properties if entry else {}
        return Release(
            world=world,
            name=name,
            tag=tag,
            hash=hash,
            released_hash=(entry.parent_hash or hash) if entry and hist.PROP_RELEASE in props else hash,
            message=props.get("causeway.release.message", ""),
            created_at=entry.commit_time if entry else None,
        )
