"""Errors of the world manager's read and rewind API (the area base lives in ``models.errors``)."""

from __future__ import annotations

from models.errors import WorldsError

__all__ = ["WorldsError"]
