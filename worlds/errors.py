"""Errors of the world manager's read and rewind API (the area base lives in ``models.errors``).

A refusal's kind is its type, so a caller (the gRPC API's status mapping, ``api.errors``) decides
by type, never by message text: :class:`WorldNotFound`, :class:`InvalidWorldRequest`,
:class:`WorldExists`, :class:`WorldMoved`; any other ``WorldsError`` is a precondition the world
does not meet (production cannot be deleted, no merge base, a plan not eligible ...). An area's
own error (``MergeError``, ``PublishError``, ``WorldError``) of a kind derives from both, e.g.
``MergeNotFound(MergeError, WorldNotFound)``.
"""

from __future__ import annotations

from models.errors import WorldsError


class WorldNotFound(WorldsError):
    """Something the request names does not exist: a world, release, commit, pending merge,
    conflict or publish plan."""


class InvalidWorldRequest(WorldsError):
    """The request itself is wrong whatever the worlds hold: a bad world id, ref, strategy, value or
    threshold, the same world as source and target, a missing required field."""


class WorldExists(WorldsError):
    """The name is taken by something else (a release name at another state: releases are immutable)."""


class WorldMoved(WorldsError):
    """The world moved since the request was planned against it; nothing changed: run it again."""


__all__ = ["InvalidWorldRequest", "WorldExists", "WorldMoved", "WorldNotFound", "WorldsError"]
