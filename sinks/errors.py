"""Errors of the write path, and the one place where a Nessie answer becomes one of them.

Retry by kind: ``NessieConflict`` → refresh and retry with backoff; ``CommitStateUnknown`` → check
whether the commit landed before retrying; ``NessieBadRequest`` / ``NessieNotFound`` → never retry.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from models.errors import CommitError, StorageError

ContentKey = tuple[str, ...]


@dataclass(frozen=True)
class Conflict:
    """One entry of Nessie's conflict list, e.g. ``VALUE_DIFFERS`` on key ``("onto", "entity_common")``.

    Types seen on 0.99: VALUE_DIFFERS and KEY_EXISTS (a concurrent writer touched the key: refresh and
    retry), UNEXPECTED_HASH (reference moved), NAMESPACE_ABSENT (no retry will help).
    """

    conflict_type: str
    key: ContentKey | None
    message: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Conflict:
        key = data.get("key")
        return cls(
            conflict_type=data.get("conflictType") or "UNKNOWN",
            key=tuple(key["elements"]) if key else None,
            message=data.get("message") or "",
        )


class NessieError(StorageError):
    """Root of every Nessie failure. ``status`` and ``error_code`` are Nessie's, when it answered."""

    def __init__(self, message: str, *, status: int | None = None, error_code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_code = error_code


class NessieBadRequest(NessieError):
    """The request is invalid (bad name, bad CEL filter, missing content id ...): never retry it."""


class NessieAuthError(NessieError):
    """401/403: the token is missing, wrong or lacks the right."""


class NessieNotFound(NessieError):
    """A reference, commit hash or content key does not exist."""


class NessieNotAnApi(NessieError):
    """The URL answered, but not as Nessie's REST v2 API (a 404 page without Nessie's error body, or
    an answer that is not Nessie's JSON): a wrong URL, never "the reference does not exist"."""


class NessieConflict(NessieError):
    """409: the expected hash or a touched key moved. ``conflicts`` holds Nessie's list (may be empty)."""

    def __init__(self, message: str, *, conflicts: tuple[Conflict, ...] = (), **kw: Any) -> None:
        super().__init__(message, **kw)
        self.conflicts = conflicts


class NessieReferenceAlreadyExists(NessieConflict):
    """Creating a branch or tag whose name is taken."""


class NessieUnavailable(NessieError):
    """Nessie did not answer usefully: connection error, timeout, 5xx, or 429 after the last retry."""


class CommitStateUnknown(NessieUnavailable, CommitError):
    """A commit, merge or transplant was sent but its outcome is unknown (timeout after sending, 5xx).

    It may have landed. Look for it (e.g. by a batch id in the commit properties) before retrying.
    """


class RetriesExhausted(NessieConflict, CommitError):
    """Every attempt of a commit met a conflict (or an unknown outcome that never showed up).

    Nothing was committed and nothing may be acked. Raised by :func:`sinks.occ.commit_loop` for
    every writer: the batch committer, schema sync, reconciliation, table evolution, merge.
    """


class BranchMissing(NessieNotFound, CommitError):
    """The branch a commit was to go to does not exist (the world was never created or was deleted)."""


class TableUnreadable(StorageError):
    """A file the branch's tables point at (metadata JSON, manifest list, manifest) is missing from
    the warehouse: deleted files, a removed warehouse directory. No retry brings it back; the world
    must be repaired (files restored, or the branch rolled back or re-created). ``path``: the file."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class UnsupportedFileFormat(StorageError):
    """A table asks for data files in a format causeway does not write (``write.format.default``
    other than Parquet): a table causeway did not create; no retry changes it."""


@contextmanager
def unreadable_if_missing(what: str, *, path: str | None = None) -> Iterator[None]:
    """Reads of a branch's tables inside raise ``TableUnreadable`` for a missing warehouse file.

    pyiceberg answers a missing metadata JSON, manifest list or manifest with FileNotFoundError, an
    OSError its callers would retry as an outage until they give up; translated here, once, so a
    caller outside ``sinks/`` catches only ``TableUnreadable``. ``path``: the file when the caller
    knows it (else the error's filename or message).
    """
    try:
        yield
    except FileNotFoundError as exc:
        missing = path or exc.filename or str(exc)
        raise TableUnreadable(f"{what}: file missing: {missing}", path=missing) from exc


_BY_STATUS: dict[int, type[NessieError]] = {
    400: NessieBadRequest,
    401: NessieAuthError,
    403: NessieAuthError,
    404: NessieNotFound,
    409: NessieConflict,
}


def error_from_response(status: int, body: bytes, *, outcome_unknown: bool = False) -> NessieError:
    """The exception for a non-2xx answer; ``outcome_unknown`` marks a sent non-idempotent request."""
    try:
        payload = json.loads(body) if body else {}
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    text = payload.get("message") or body.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    code = payload.get("errorCode")
    if status == 404 and not code:
        # Nessie names every 404 (REFERENCE_NOT_FOUND, CONTENT_NOT_FOUND ...); another server does not.
        return NessieNotAnApi(f"HTTP 404 without a Nessie error body: {text[:200]}", status=status)
    message = f"Nessie {status} {code or ''}: {text}".replace("  ", " ")
    if status >= 500:
        cls: type[NessieError] = CommitStateUnknown if outcome_unknown else NessieUnavailable
        return cls(message, status=status, error_code=code)
    if status == 429:
        # A rate-limit refusal happens before any work, so even a commit is known not to have landed.
        return NessieUnavailable(message, status=status, error_code=code)
    if status == 409:
        details = payload.get("errorDetails") or {}
        conflicts = tuple(Conflict.from_json(c) for c in details.get("conflicts") or ())
        cls409 = NessieReferenceAlreadyExists if code == "REFERENCE_ALREADY_EXISTS" else NessieConflict
        return cls409(message, conflicts=conflicts, status=status, error_code=code)
    return _BY_STATUS.get(status, NessieError)(message, status=status, error_code=code)


def error_from_transport(exc: Exception, *, outcome_unknown: bool) -> NessieUnavailable:
    """The exception for a request that got no HTTP answer (refused, timed out, cut off)."""
    message = f"Nessie unreachable: {type(exc).__name__}: {exc}"
    if outcome_unknown:
        return CommitStateUnknown(message + " (the request was sent; it may have been applied)")
    return NessieUnavailable(message)
