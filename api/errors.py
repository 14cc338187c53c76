"""Errors of the API and the one place where any error becomes a gRPC status code and message.

Lower layers raise their own errors (``sinks.errors``, ``worlds.errors``, ``worlds.manager``,
``models.worlds``); :func:`status_for` maps each to a code a client can act on, by type only: a
worlds refusal's kind is its class (``worlds.errors``: not found, invalid request, exists, moved;
see docs/api.md), never its message text.
"""

from __future__ import annotations

import grpc

from models.worlds import InvalidWorldId
from sinks.errors import (
    NessieAuthError,
    NessieBadRequest,
    NessieConflict,
    NessieNotFound,
    NessieReferenceAlreadyExists,
    NessieUnavailable,
)
from worlds.errors import InvalidWorldRequest, WorldExists, WorldMoved, WorldNotFound, WorldsError
from worlds.refs import InvalidRef


class ApiError(Exception):
    """Root of the API's own errors; ``code`` is the gRPC status it is answered with.

    ``status_details``: a serialized ``google.rpc.Status`` sent as the ``grpc-status-details-bin``
    trailer (the gRPC rich error model), stored with the outcome under an idempotency key.
    """

    code = grpc.StatusCode.INTERNAL
    status_details: bytes = b""


class InvalidRequest(ApiError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ApiError):
    code = grpc.StatusCode.NOT_FOUND


class HeadMoved(ApiError):
    """An ``expected_hash`` no longer matches the world's head."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class KeyReused(ApiError):
    """An idempotency key already used (or in flight) for a different request."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class InFlight(ApiError):
    """Another call holds the idempotency key and did not finish within the wait: retry with the same key."""

    code = grpc.StatusCode.UNAVAILABLE


class MergeConflicts(ApiError):
    """A merge met conflicts and wrote nothing; the conflicts are in ``status_details``."""

    code = grpc.StatusCode.ABORTED

    def __init__(self, message: str, status_details: bytes) -> None:
        super().__init__(message)
        self.status_details = status_details


class Unauthenticated(ApiError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ApiError):
    code = grpc.StatusCode.PERMISSION_DENIED


#: Outcomes worth storing under an idempotency key: definitive answers, not transient failures.
DEFINITIVE = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

#: A refusal of the worlds area answers by its kind (its type, ``worlds.errors``); any other
#: ``WorldsError`` is a precondition the world does not meet.
_WORLDS_KINDS: tuple[tuple[type[WorldsError], grpc.StatusCode], ...] = (
    (WorldNotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidWorldRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (WorldExists, grpc.StatusCode.ALREADY_EXISTS),
    (WorldMoved, grpc.StatusCode.FAILED_PRECONDITION),
)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and message for an error raised while serving a call."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, ApiError):
        return exc.code, message
    if isinstance(exc, InvalidWorldId | InvalidRef):
        return grpc.StatusCode.INVALID_ARGUMENT, message
    if isinstance(exc, WorldsError):
        for kind, code in _WORLDS_KINDS:
            if isinstance(exc, kind):
                return code, message
        return grpc.StatusCode.FAILED_PRECONDITION, message
    if isinstance(exc, NessieReferenceAlreadyExists):
        return grpc.StatusCode.ALREADY_EXISTS, message
    if isinstance(exc, NessieConflict):
        return grpc.StatusCode.FAILED_PRECONDITION, f"the world's head moved: {message}"
    if isinstance(exc, NessieNotFound):
        return grpc.StatusCode.NOT_FOUND, message
    if isinstance(exc, NessieBadRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, message
    if isinstance(exc, NessieAuthError):
        return grpc.StatusCode.INTERNAL, "the API server's own Nessie credentials were refused"
    if isinstance(exc, NessieUnavailable):
        return grpc.StatusCode.UNAVAILABLE, message
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the server log"
