"""Counting the calls of a function or method a test watches (the work a change removes)."""

from __future__ import annotations

from typing import Any


def count_calls(monkeypatch: Any, owner: Any, name: str) -> list[tuple[Any, ...]]:
    """The arguments of every call of ``owner.name`` from now on (each call still made)."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(owner, name)

    def counting(*a: Any, **kw: Any) -> Any:
        calls.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(owner, name, counting)
    return calls
