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


def counting_local_fs() -> tuple[Any, dict[str, int]]:
    """pyiceberg's local filesystem, counting the directory creations and stats asked of it."""
    from pyiceberg.io.pyarrow import PyArrowLocalFileSystem

    counts = {"create_dir": 0, "get_file_info": 0}

    class Counting(PyArrowLocalFileSystem):  # type: ignore[misc]
        def create_dir(self, *a: Any, **kw: Any) -> Any:
            counts["create_dir"] += 1
            return super().create_dir(*a, **kw)

        def get_file_info(self, *a: Any, **kw: Any) -> Any:
            counts["get_file_info"] += 1
            return super().get_file_info(*a, **kw)

    return Counting(), counts
