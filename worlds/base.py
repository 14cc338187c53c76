"""The core every world API part shares: the client, the catalog, resolving refs, metadata reads."""

from __future__ import annotations

import gzip
from datetime import datetime
from typing import Any, Self

import orjson
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import load_file_io
from pyiceberg.table import Table

from models.worlds import InvalidWorldId, WorldNaming
from sinks.catalog import NessieCatalog
from sinks.errors import NessieNotFound
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings
from worlds.errors import InvalidWorldRequest, WorldNotFound
from worlds.refs import InvalidRef, Resolved, WorldRef, release_tag


class WorldsBase:
    """Holds the Nessie client and the catalog; resolves world refs to pinned commits."""

    def __init__(self, settings: Settings, client: SyncNessieClient | None = None) -> None:
        self.settings = settings
        self.naming = WorldNaming(settings.prod_world, settings.main_branch)
        self._own_client = client is None
        self.client = client or SyncNessieClient.from_settings(settings)
        self.catalog = NessieCatalog.from_settings(settings, settings.main_branch, client=self.client)
        self._metadata_cache: dict[str, dict[str, Any]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(settings)

    def close(self) -> None:
        if self._own_client:
            self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- refs ------------------------------------------------------------------------------------

    def branch(self, world: str) -> str:
        try:
            return self.naming.branch(world)
        except InvalidWorldId as exc:
            raise InvalidWorldRequest(str(exc)) from exc

    def head(self, world: str) -> Reference:
        try:
            return self.client.get_reference(self.branch(world))
        except NessieNotFound as exc:
            raise WorldNotFound(f"world {world!r} does not exist (no branch {self.branch(world)})") from exc

    def resolve(self, ref: WorldRef | str) -> Resolved:
        """One commit for a world ref: the head, a hash on the branch, the last commit at a time, a release."""
        wref = _parse(ref)
        if wref.release:
            tag = release_tag(wref.world, wref.release)
            try:
                found = self.client.get_reference(tag)
            except NessieNotFound as exc:
                raise WorldNotFound(f"release {wref} does not exist") from exc
            return Resolved(wref, tag, found.hash, self._commit_time(f"{tag}@{found.hash}"))
        branch = self.head(wref.world).name
        if wref.hash:
            try:
                entry = self._first(f"{branch}@{self._expand(branch, wref.hash)}")
            except NessieNotFound as exc:
                raise WorldNotFound(f"commit {wref.hash} is not on world {wref.world!r}") from exc
            if entry is None:
                raise WorldNotFound(f"commit {wref.hash} is not on world {wref.world!r}")
            return Resolved(wref, branch, entry.hash, entry.commit_time)
        if wref.at:
            ms = int(wref.at.timestamp() * 1000)
            try:
                entry = self._first(f"{branch}*{ms}")
            except NessieNotFound:
                entry = None
            if entry is None:
                raise WorldNotFound(f"world {wref.world!r} has no commit at or before {wref.at.isoformat()}")
            return Resolved(wref, branch, entry.hash, entry.commit_time)
        entry = self._first(branch)
        if entry is None:
            raise WorldNotFound(f"world {wref.world!r} has no commit")
        return Resolved(wref, branch, entry.hash, entry.commit_time)

    def _expand(self, branch: str, prefix: str, max_commits: int = 100_000) -> str:
        """A full commit hash from the prefix the CLI prints (Nessie resolves full hashes only)."""
        if len(prefix) == 64:
            return prefix
        for n, entry in enumerate(self.client.history_entries(branch, max_records=500)):
            if entry.hash.startswith(prefix):
                return entry.hash
            if n >= max_commits:
                break
        raise WorldNotFound(f"commit {prefix} is not on branch {branch} (within {max_commits:,} commits)")

    def _first(self, ref: str) -> Any:
        for page in self.client.history(ref, max_records=1):
            return next(iter(page), None)
        return None

    def _commit_time(self, ref: str) -> datetime | None:
        entry = self._first(ref)
        return entry.commit_time if entry else None

    def table(self, pinned: str, name: str) -> Table | None:
        """A table read at a pinned ref, or None when the world has no such table there."""
        try:
            return self.catalog.at(pinned).load_table((self.settings.namespace, name))
        except NoSuchTableError:
            return None

    def metadata(self, location: str) -> dict[str, Any]:
        """A table metadata file as raw JSON (files are immutable: cached by location)."""
        cached = self._metadata_cache.get(location)
        if cached is not None:
            return cached
        io = load_file_io(self.catalog.properties, location)
        with io.new_input(location).open() as f:
            raw = f.read()
        if location.endswith(".gz.metadata.json") or raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = orjson.loads(raw)
        if len(self._metadata_cache) > 4096:
            self._metadata_cache.clear()
        self._metadata_cache[location] = data
        return data


def _parse(ref: WorldRef | str) -> WorldRef:
    if isinstance(ref, WorldRef):
        return ref
    try:
        return WorldRef.parse(ref)
    except InvalidRef as exc:
        raise InvalidWorldRequest(str(exc)) from exc
