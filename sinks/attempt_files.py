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
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

T = TypeVar("T")


def write_key(metadata: Any) -> tuple[Hashable, ...]:
    """What a data file written under ``metadata`` (a pyiceberg ``TableMetadata``) depends on, besides
    its rows: the current schema, the specs (a small flush may write under the unpartitioned one)
    and the default, and the ``write.*`` properties (format, compression, target size)."""
    return (
        # the table itself: an operator may drop and recreate a table between two attempts
        str(metadata.table_uuid),
        metadata.location,
        metadata.format_version,
        metadata.current_schema_id,
        metadata.default_spec_id,
        tuple(sorted(spec.spec_id for spec in metadata.partition_specs)),
        tuple(sorted((k, v) for k, v in metadata.properties.items() if k.startswith("write."))),
    )


def commit_time(first: datetime, head_ms: int | None, clock: Callable[[], datetime]) -> datetime:
    """The ``committed_at`` an attempt stamps its rows with: the batch's first attempt's time while the
    branch's head is older than it, so a retry can take that attempt's files.

    A retry after a rival commit that landed *after* that time must not stamp its rows earlier than
    the rival's: the log's readers fold it in ``committed_at`` order (a TRUNCATE drops the older
    keys of its type, ``agents.reconcile_state``). Then the attempt takes a fresh time, after the
    head's, and writes its rows anew. ``head_ms``: the event log's current snapshot time (ms), None
    for a table with no snapshot.
    """
    if head_ms is None or head_ms < first.timestamp() * 1000:
        return first
    return max(clock(), datetime.fromtimestamp(head_ms / 1000, UTC) + timedelta(milliseconds=1))


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
