"""Nessie faults for tests: a commit that lands but whose answer is lost (an unknown outcome)."""

from __future__ import annotations

from typing import Any

import pytest

from sinks.errors import CommitStateUnknown
from sinks.nessie import SyncNessieClient


def lose_first_answer(client: SyncNessieClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ``client``'s first commit land on Nessie and then raise CommitStateUnknown.

    Returns the list that receives the hash of every commit that landed through ``client``.
    """
    real = client.commit
    landed: list[str] = []

    def commit(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        landed.append(result.hash)
        if len(landed) == 1:
            raise CommitStateUnknown("the answer was lost after sending (injected)")
        return result

    monkeypatch.setattr(client, "commit", commit)
    return landed
