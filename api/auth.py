"""Who may call what: bearer tokens from a token file (hashed at rest) and three roles.

Token file: one ``name role sha256-hex`` per line (``#`` comments), written by ``causeway
api-token``. Only the SHA-256 of a token is stored; tokens are 32 random bytes, so a plain hash is
enough (no dictionary to attack). The decision is pure and uses only the token and the request's
target world id: it never looks a world up, so a refusal never tells whether the world exists.

Roles (each includes the ones before it):

* ``reader``: GetWorld, ListWorlds, ListReleases, GetCommitHistory, GetDiff, GetEntityAudit, QueryAt,
  ListConflicts, PublishStatus, ListPublishLog;
* ``operator``: CreateWorld, ForkWorld, CreateRelease, MergeWorld, ResolveConflict, ContinueMerge,
  AbortMerge, Rollback, ApplyChanges, PublishAudit, PublishApprove, PublishRun in non-production
  worlds (merge and publish: the target world);
* ``admin``: anything, including any write to the production world, DeleteWorld and DeleteRelease.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from api.errors import PermissionDenied, Unauthenticated


class Role(IntEnum):
    reader = 1
    operator = 2
    admin = 3


#: The least role per method; writes to the production world need admin whatever this says.
METHOD_ROLE: dict[str, Role] = {
    "GetWorld": Role.reader,
    "ListWorlds": Role.reader,
    "ListReleases": Role.reader,
    "GetCommitHistory": Role.reader,
    "GetDiff": Role.reader,
    "GetEntityAudit": Role.reader,
    "QueryAt": Role.reader,
    "ListConflicts": Role.reader,
    "PublishStatus": Role.reader,
    "ListPublishLog": Role.reader,
    "CreateWorld": Role.operator,
    "ForkWorld": Role.operator,
    "CreateRelease": Role.operator,
    "MergeWorld": Role.operator,
    "Rollback": Role.operator,
    "ApplyChanges": Role.operator,
    "ResolveConflict": Role.operator,
    "ContinueMerge": Role.operator,
    "AbortMerge": Role.operator,
    "PublishAudit": Role.operator,  # checked against the source world (the audit writes only the publish log)
    "PublishApprove": Role.operator,  # checked against the plan's target: into prod needs admin
    "PublishRun": Role.operator,
    "DeleteWorld": Role.admin,
    "DeleteRelease": Role.admin,
}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: the token's name (what logs show) and its role."""

    name: str
    role: Role


class TokenFileError(ValueError):
    """The token file cannot be read; the message names the line."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "cwy_" + secrets.token_urlsafe(32)


def token_line(name: str, role: Role, token: str) -> str:
    return f"{name} {role.name} {hash_token(token)}"


def parse_tokens(text: str) -> dict[str, Principal]:
    """Token hash → principal, from a token file's text."""
    out: dict[str, Principal] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or parts[1] not in Role.__members__ or len(parts[2]) != 64:
            raise TokenFileError(f"token file line {n}: expected `name reader|operator|admin sha256-hex`")
        out[parts[2].lower()] = Principal(parts[0], Role[parts[1]])
    return out


def load_tokens(path: str) -> dict[str, Principal]:
    try:
        return parse_tokens(Path(path).read_text())
    except FileNotFoundError as exc:
        raise TokenFileError(f"token file {path} does not exist; create one with `causeway api-token`") from exc


def bearer(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header, if any."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def authenticate(tokens: dict[str, Principal], token: str | None) -> Principal:
    if not token:
        raise Unauthenticated("missing bearer token (send `authorization: Bearer <token>`)")
    digest = hash_token(token)
    for known, principal in tokens.items():
        if hmac.compare_digest(known, digest):
            return principal
    raise Unauthenticated("invalid bearer token")


def authorize(principal: Principal, method: str, world: str | None, prod_world: str) -> None:
    """Raise PermissionDenied unless ``principal`` may call ``method`` on ``world`` (no lookup is made)."""
    need = METHOD_ROLE.get(method, Role.admin)
    if need >= Role.operator and world == prod_world:
        need = Role.admin
    if principal.role < need:
        target = f" on world {world!r}" if world else ""
        raise PermissionDenied(f"{method}{target} needs role {need.name}; {principal.name!r} has {principal.role.name}")
