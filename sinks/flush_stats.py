"""What one table's part of a flush cost (rows and bytes written, deleted, rewritten, read)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FlushStats:
    """What one table's part of a flush cost: rows and bytes written, deleted, rewritten and read."""

    rows_written: int = 0  # new row versions (events for the log)
    rows_deleted: int = 0  # positions newly masked by the delete file
    rows_rewritten: int = 0  # live rows copied out of compacted files
    files_added: int = 0
    files_removed: int = 0
    bytes_written: int = 0  # every new data + delete file
    bytes_rewritten: int = 0  # bytes of new files that carry already-stored rows (compaction, merge)
    bytes_read: int = 0  # files read to decide (index) or to compact
    values_unconverted: int = 0  # property values left null in their typed column (kept in the JSON)
