"""A bounded map that forgets its least recently used entry: the caches' one eviction rule (pure).

Not locked: the caches that share it across threads hold their own lock around each call.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(OrderedDict[K, V]):
    """At most ``bound`` entries; keeping one past it drops the least recently used."""

    def __init__(self, bound: int) -> None:
        super().__init__()
        self.bound = bound

    def recent(self, key: K) -> V | None:
        """The entry of ``key`` (None when absent), now the most recently used."""
        found = self.get(key)
        if found is not None:
            self.move_to_end(key)
        return found

    def keep(self, key: K, value: V) -> None:
        """Keep ``key`` as the most recently used; past the bound the least recently used goes."""
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.bound:
            self.popitem(last=False)
