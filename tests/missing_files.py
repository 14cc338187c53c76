"""A world branch whose log points at a manifest list that is gone from the warehouse: a real
Iceberg metadata JSON (its current snapshot names a manifest list never written) served by a
stand-in Nessie client. Shared by the unit tests of the sinks' reads of such a branch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

from sinks.committer import PROP_BATCH
from sinks.nessie import IcebergTable, LogEntry
from sinks.tables import EVENTS


@dataclass
class MissingManifestList:
    """A stand-in Nessie client: every table of every ref is the broken log; one batch commit."""

    warehouse: str
    metadata: str  # the metadata JSON (present)
    manifest_list: str  # what it points at (gone)

    def get_contents(self, ref: str, keys: list[tuple[str, ...]]) -> dict[tuple[str, ...], IcebergTable]:
        return {k: IcebergTable(self.metadata, id="c1") for k in keys}

    def history(self, ref: str, **_: Any) -> list[list[LogEntry]]:
        entry = LogEntry("a" * 64, "batch", "causeway", {PROP_BATCH: "b-1"}, datetime(2026, 12, 1, tzinfo=UTC))
        return [[entry]]


def missing_manifest_list(tmp_path: Path) -> MissingManifestList:
    """Write the log's metadata JSON under ``tmp_path``; its manifest list is never written."""
    location = f"file://{tmp_path}/onto/{EVENTS.name}"
    manifest_list = f"{location}/metadata/snap-1.avro"
    meta = new_table_metadata(EVENTS.schema, EVENTS.spec, EVENTS.sort_order, location, {})
    snap = Snapshot(
        snapshot_id=1,
        sequence_number=1,
        timestamp_ms=1,
        manifest_list=manifest_list,
        summary=Summary(Operation.APPEND),
        schema_id=meta.current_schema_id,
    )
    ref = SnapshotRef(snapshot_id=1, snapshot_ref_type=SnapshotRefType.BRANCH)
    meta = meta.model_copy(
        update={"snapshots": [snap], "current_snapshot_id": 1, "refs": {"main": ref}, "last_sequence_number": 1}
    )
    path = f"{location}/metadata/00001.metadata.json"
    ToOutputFile.table_metadata(meta, PyArrowFileIO().new_output(path))
    return MissingManifestList(f"file://{tmp_path}", path, manifest_list)
