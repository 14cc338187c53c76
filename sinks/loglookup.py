"""Which of some event ids a world's event log holds, without reading every log file.

The applier asks the log about causes Redis has no mark for (expired, lost, inherited by a fork,
or simply not arrived yet), and the committer about recorded offsets, stale events and copies
after a TRUNCATE. A pyiceberg scan with ``In(event_id, ...)`` reads every log file's
``event_id`` column (random ids defeat min/max pruning) and binds the predicate per file: its
cost grows with the log for good. In a 30-minute soak at 5,000 events/s the lookups of causes
that had not arrived yet took about a third of the worker's CPU, and the worker fell behind.

Here each log file gets the key filter of its ``event_id`` column (:mod:`sinks.keyfilter`, kept
in the committer's :class:`~sinks.rowdelta.FileCache`, built the first time the file is read; an
evicted one is read back from the worker's local spill, :mod:`sinks.filter_spill`, not rebuilt),
so a lookup reads only the files that may hold one of the ids: an absent id costs a probe per
file, not a read. Small files (no filter) are read from the rows the cache keeps of the files
the worker just wrote, or read whole. A file with position deletes applied to it is answered by
pyiceberg's scan (the log is append-only and compacted by rewriting; nothing writes deletes into
it today, so that path is for tables written by another engine).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sinks.keyfilter import Probe
from sinks.rowdelta import FileCache, plan_live_files

COLUMNS = ("event_id", "applied")


def logged_events(table: Any, ids: set[str], cache: FileCache | None = None) -> dict[str, bool]:
    """``{event_id: applied}`` for those of ``ids`` that ``entity_events`` (as loaded) holds.

    ``applied`` is false when every row of the id was refused by the version rule. With a
    ``cache``, only the files whose ``event_id`` filter may hold one of ``ids`` are read.
    """
    if not ids:
        return {}
    if cache is None or not cache.max_bytes:
        return _scanned(table, ids)
    tasks = plan_live_files(table)
    if any(t.delete_files for t in tasks):
        return _scanned(table, ids)
    wanted = pa.array(sorted(ids), pa.string())
    probe = Probe.of(wanted)
    out: dict[str, bool] = {}
    for task in tasks:
        path = task.file.file_path
        held = cache.key_filter(path, COLUMNS[0])
        if held is not None and not held.may_hold(probe):
            continue
        rows = cache.rows(path)
        if rows is None:
            # A file too small for a filter is read by every lookup: its columns are kept (read
            # from storage on every cause lookup before). A filtered file is read again only for
            # the ids it may hold (rare), so its columns would only take the key index's room.
            small = task.file.record_count < cache.min_filter_rows
            try:
                rows, _ = cache.get(table.io, path, COLUMNS, keep=small)
            except (KeyError, pa.ArrowInvalid):
                return _scanned(table, ids)  # a file of another schema: matched by field id there
        if held is None:
            cache.seed_filter(path, COLUMNS[0], rows.column(COLUMNS[0]))
        _collect(rows, wanted, out)
    return out


def _collect(rows: pa.Table, wanted: pa.Array, out: dict[str, bool]) -> None:
    hits = rows.select(list(COLUMNS)).filter(pc.is_in(rows.column(COLUMNS[0]), value_set=wanted))
    for eid, applied in zip(hits.column(0).to_pylist(), hits.column(1).to_pylist(), strict=True):
        out[eid] = out.get(eid, False) or bool(applied)


def _scanned(table: Any, ids: set[str]) -> dict[str, bool]:
    from pyiceberg.expressions import In

    wanted = In("event_id", sorted(ids))  # type: ignore[call-arg, arg-type]
    rows = table.scan(row_filter=wanted, selected_fields=COLUMNS).to_arrow()
    out: dict[str, bool] = {}
    _collect(rows, pa.array(sorted(ids), pa.string()), out)
    return out
