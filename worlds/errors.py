"""Errors of the world manager's read and rewind API."""

from __future__ import annotations


class WorldsError(Exception):
    """A world read or rewind that cannot be done; the message says why and what to do."""
