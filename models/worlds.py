"""World ids and the world ↔ Nessie branch mapping.

A world id reaches Nessie as part of a reference name, so it is checked against a strict pattern
before it is used anywhere: lower-case ASCII letters, digits, ``-`` and ``_``, starting with a letter
or digit, at most 63 characters. That rules out ``@`` (hash suffix), ``~``/``*`` (time travel),
``/``/``..`` (paths), whitespace, control and non-ASCII characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from models.errors import InputError

WORLD_ID_MAX = 63
_WORLD_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
BRANCH_PREFIX = "world-"


class InvalidWorldId(InputError, ValueError):
    """A world id that may not become a branch name; ``reason`` is a short machine-readable code."""

    def __init__(self, world_id: object, reason: str, detail: str) -> None:
        self.world_id = world_id
        self.reason = reason
        super().__init__(f"invalid world id {str(world_id)[:80]!r}: {detail}")


def validate_world_id(world_id: object) -> str:
    """Return ``world_id`` if it is a valid world id; raise InvalidWorldId saying why not."""
    if not isinstance(world_id, str):
        raise InvalidWorldId(world_id, "not-a-string", f"expected a string, got {type(world_id).__name__}")
    if not world_id:
        raise InvalidWorldId(world_id, "empty", "must not be empty")
    if len(world_id) > WORLD_ID_MAX:
        raise InvalidWorldId(world_id, "too-long", f"{len(world_id)} characters; at most {WORLD_ID_MAX}")
    if not world_id.isascii():
        raise InvalidWorldId(world_id, "non-ascii", "only ASCII letters, digits, '-' and '_' are allowed")
    if not _WORLD_ID.fullmatch(world_id):
        raise InvalidWorldId(
            world_id,
            "bad-characters",
            "use lower-case letters, digits, '-' and '_', starting with a letter or digit",
        )
    return world_id


@dataclass(frozen=True)
class WorldNaming:
    """Maps worlds to branches: the production world to ``main_branch``, any other X to ``world-X``."""

    prod_world: str = "prod"
    main_branch: str = "main"

    def branch(self, world_id: str) -> str:
        validate_world_id(world_id)
        if world_id == self.prod_world:
            return self.main_branch
        return BRANCH_PREFIX + world_id

    def world(self, branch: str) -> str | None:
        """The world a branch holds, or None if the branch is not a world branch."""
        if branch == self.main_branch:
            return self.prod_world
        if branch.startswith(BRANCH_PREFIX):
            candidate = branch[len(BRANCH_PREFIX) :]
            try:
                return validate_world_id(candidate)
            except InvalidWorldId:
                return None
        return None
