"""Table pointers as the operations of one Nessie commit, for writers that prepare metadata files.

For writers that prepare whole metadata files themselves (a rollback restores earlier table
states) rather than staging pyiceberg updates through ``NessieCatalog``: each table's new metadata
location is PUT (with the current content id), tables to drop are DELETEd, and tables that must
not have moved are sent as UNCHANGED, so Nessie refuses the commit if any of them changed since
the expected hash (its rebase over unrelated commits never hides a change to these keys). The
operations are committed through the one commit loop, :func:`sinks.occ.commit_operations`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sinks.errors import ContentKey
from sinks.nessie import Operation


@dataclass(frozen=True)
class TablePointer:
    """A table's new metadata file; ``content_id`` is the key's current id (None for a new key)."""

    key: ContentKey
    metadata_location: str
    metadata: Mapping[str, Any]  # the file's JSON (ids for the pointer are read from it)
    content_id: str | None

    def operation(self) -> Operation:
        snapshot = self.metadata.get("current-snapshot-id")
        return Operation.put_table(
            self.key,
            self.metadata_location,
            snapshot_id=snapshot if snapshot is not None else -1,
            schema_id=int(self.metadata.get("current-schema-id", 0)),
            spec_id=int(self.metadata.get("default-spec-id", 0)),
            sort_order_id=int(self.metadata.get("default-sort-order-id", 0)),
            content_id=self.content_id,
        )


def pointer_operations(
    *,
    puts: Sequence[TablePointer] = (),
    deletes: Sequence[ContentKey] = (),
    unchanged: Sequence[ContentKey] = (),
) -> list[Operation]:
    """The operations of one atomic commit; a commit of them conflicts when a touched or UNCHANGED key moved."""
    ops = [p.operation() for p in puts]
    ops += [Operation.delete(k) for k in deletes]
    ops += [Operation("UNCHANGED", tuple(k)) for k in unchanged]
    if not ops:
        raise ValueError("a pointer commit needs at least one operation")
    return ops
