"""World references and release names (pure).

A *world ref* names a state of a world, in the forms every ``causeway worlds`` command accepts:

* ``WORLD`` — the head of the world's branch;
* ``WORLD@HASH`` — a commit (8 to 64 hex digits) on that branch;
* ``WORLD@TIME`` — the last commit at or before an ISO-8601 time (``2026-11-30T14:00:00Z``);
  a pin made of hex digits only is always a hash, so times are never given as epoch numbers here;
* ``WORLD/RELEASE`` — a release of the world (a Nessie tag ``release/WORLD/RELEASE``).

World ids and release names share one strict pattern (``models.worlds``), so neither can hold
``@``, ``/``, ``*`` or ``~`` and the forms never overlap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from models.worlds import InvalidWorldId, WorldNaming, validate_world_id

RELEASE_PREFIX = "release/"
_HEX = re.compile(r"[0-9a-fA-F]{8,64}")


class InvalidRef(ValueError):
    """A world ref or release name that cannot be parsed; the message says which form is expected."""


def validate_release_name(name: str) -> str:
    """Release names follow the world-id pattern (lower-case letters, digits, '-', '_', ≤ 63)."""
    try:
        return validate_world_id(name)
    except InvalidWorldId as exc:
        raise InvalidRef(str(exc).replace("world id", "release name")) from exc


def release_tag(world_id: str, name: str) -> str:
    """The Nessie tag of release ``name`` of ``world_id``."""
    return f"{RELEASE_PREFIX}{validate_world_id(world_id)}/{validate_release_name(name)}"


def parse_release_tag(tag: str) -> tuple[str, str] | None:
    """``release/W/N`` → ``(W, N)``; None for any other tag."""
    if not tag.startswith(RELEASE_PREFIX):
        return None
    parts = tag[len(RELEASE_PREFIX) :].split("/")
    if len(parts) != 2:
        return None
    try:
        return validate_world_id(parts[0]), validate_release_name(parts[1])
    except (InvalidWorldId, InvalidRef):
        return None


def parse_time(value: str) -> datetime:
    """ISO-8601 (``Z`` or an offset; a naive time is UTC) or epoch milliseconds, as an aware datetime."""
    text = value.strip()
    if text.isdigit():
        return datetime.fromtimestamp(int(text) / 1000, UTC)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidRef(f"not a time: {value!r} (use ISO-8601 like 2026-11-30T14:00:00Z or epoch ms)") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class WorldRef:
    """A parsed world ref: exactly one of ``hash``, ``at`` and ``release`` may be set."""

    world: str
    hash: str | None = None
    at: datetime | None = None
    release: str | None = None

    @classmethod
    def parse(cls, text: str) -> WorldRef:
        if "/" in text:
            world, _, release = text.partition("/")
            return cls(_world(world, text), release=validate_release_name(release))
        if "@" in text:
            world, _, pin = text.partition("@")
            if _HEX.fullmatch(pin):
                return cls(_world(world, text), hash=pin.lower())
            return cls(_world(world, text), at=parse_time(pin))
        return cls(_world(text, text))

    def nessie_name(self, naming: WorldNaming) -> str:
        """The Nessie reference holding this state: the world's branch, or the release tag."""
        return release_tag(self.world, self.release) if self.release else naming.branch(self.world)

    def __str__(self) -> str:
        if self.release:
            return f"{self.world}/{self.release}"
        if self.hash:
            return f"{self.world}@{self.hash}"
        if self.at:
            return f"{self.world}@{self.at.isoformat().replace('+00:00', 'Z')}"
        return self.world


def _world(world: str, text: str) -> str:
    try:
        return validate_world_id(world)
    except InvalidWorldId as exc:
        raise InvalidRef(
            f"not a world ref: {text!r} ({exc}); use WORLD, WORLD@HASH, WORLD@TIME or WORLD/RELEASE"
        ) from exc


@dataclass(frozen=True)
class Resolved:
    """A world ref resolved to one commit: ``pinned`` (``name@hash``) is what every read uses."""

    ref: WorldRef
    name: str  # the branch or tag
    hash: str
    commit_time: datetime | None = None

    @property
    def pinned(self) -> str:
        return f"{self.name}@{self.hash}"

    def describe(self) -> str:
        when = f" ({self.commit_time.isoformat()})" if self.commit_time else ""
        return f"{self.ref} = commit {self.hash[:16]} on {self.name}{when}"
