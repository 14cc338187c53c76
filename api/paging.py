"""Page tokens (pure): opaque to clients, a small JSON document inside.

A token records where the next page starts *and the commit the first page was read at*, so every
page of one listing is read at the same state even when the world moves between calls.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import orjson

from api.errors import InvalidRequest

T = TypeVar("T")
DEFAULT_PAGE = 100
MAX_PAGE = 1000


def page_size(requested: int) -> int:
    if requested < 0:
        raise InvalidRequest(f"page_size {requested} is negative")
    return min(requested or DEFAULT_PAGE, MAX_PAGE)


def encode(kind: str, **state: Any) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"kind": kind, **state})).decode().rstrip("=")


def decode(token: str, kind: str) -> dict[str, Any] | None:
    """The state of ``token`` (None for an empty token); InvalidRequest for a token of another listing."""
    if not token:
        return None
    try:
        state = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except ValueError as exc:
        raise InvalidRequest("page_token is not a token this server issued") from exc
    if not isinstance(state, dict) or state.get("kind") != kind:
        raise InvalidRequest(f"page_token was issued for another listing, not {kind}")
    return state


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    page: list[T] = []
    for item in items:
        page.append(item)
        if len(page) == size:
            yield page
            page = []
    if page:
        yield page


def after(items: list[T], key: Any, start: str | None) -> list[T]:
    """The items (sorted by ``key``) strictly after ``start``."""
    return [i for i in items if start is None or key(i) > start]
