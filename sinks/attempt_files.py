"""The data files one batch's commit attempts wrote, kept for its retries (pure bookkeeping).

A conflict (another writer moved the branch) makes the commit loop start the batch's attempt again
at the new head (:mod:`sinks.occ`): every decision taken against the old head is taken again. The
files holding the batch's new rows need not be written again: their content depends on the head
only through what :func:`write_key` names (the table's schema, specs and write properties) and on
what the attempt decided (which events' rows are written, which are stale). With two workers on
one world a conflict is the other worker's commit, which touches other keys: the plan comes out the
same and the retry takes the files the failed attempt wrote. They were never referenced (the failed
commit published nothing), so taking them is the same as writing them again; a retry whose inputs
differ writes new files, and the old ones stay orphans as before.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


def write_key(metadata: Any) -> tuple[Hashable, ...]:
    """What a data file written under ``metadata`` (a pyiceberg ``TableMetadata``) depends on, besides
    its rows: the current schema, the specs (a small flush may write under the unpartitioned one)
    and the default, and the ``write.*`` properties (format, compression, target size)."""
    return (
        metadata.current_schema_id,
        metadata.default_spec_id,
        tuple(sorted(spec.spec_id for spec in metadata.partition_specs)),
        tuple(sorted((k, v) for k, v in metadata.properties.items() if k.startswith("write."))),
    )


class AttemptFiles:
    """What one batch's attempts wrote, by key: a later attempt with the same key takes it.

    One per ``commit_batch`` call (attempts of one batch run one after another in one thread)."""

    def __init__(self) -> None:
        self._written: dict[Hashable, Any] = {}
        #: How many writes a later attempt took instead of writing again (for tests and logs).
        self.reused = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._written

    def written(self, key: Hashable, write: Callable[[], T]) -> T:
        """``write()``'s result, or what an earlier attempt's ``write()`` under ``key`` returned."""
        if key in self._written:
            self.reused += 1
            return self._written[key]
        result = self._written[key] = write()
        return result
