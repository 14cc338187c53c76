# mypy: disable-error-code="call-arg"
"""Manifests and manifest lists read through the kept reader trees equal pyiceberg's own reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

import sinks.manifest_cache
from sinks.manifest_cache import _fetch_entries, _ListCache

SCHEMA = Schema(NestedField(1, "pk", StringType(), required=False), NestedField(2, "v", LongType(), required=False))


def _manifest(io: PyArrowFileIO, path: str, files: int, snapshot_id: int = 7) -> ManifestFile:
    with write_manifest(2, UNPARTITIONED_PARTITION_SPEC, SCHEMA, io.new_output(path), snapshot_id, "deflate") as w:
        for n in range(files):
            df = DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=f"{path}-{n}.parquet",
                file_format=FileFormat.PARQUET,
                partition=Record(),
                record_count=10 + n,
                file_size_in_bytes=100 + n,
                lower_bounds={1: b"a"},
                upper_bounds={1: b"z"},
            )
            if n == files - 1:  # a deleted entry (discarded on request)
                entry = ManifestEntry.from_args(
                    status=ManifestEntryStatus.DELETED,
                    snapshot_id=snapshot_id,
                    sequence_number=1,
                    file_sequence_number=1,
                    data_file=df,
                )
            else:
                entry = ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=df)
            w.add_entry(entry)
    return w.to_manifest_file()


def test_entries_and_lists_read_like_pyiceberg_and_resolve_each_schema_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resolving a reader tree per Avro file was ~85 % of a manifest read; fails if it comes back."""
    io = PyArrowFileIO()
    manifests = [_manifest(io, f"file://{tmp_path}/m{n}.avro", files=3 + n) for n in range(3)]
    resolved: list[object] = []
    real = sinks.manifest_cache.resolve_reader

    def counting(*a: Any) -> Any:
        resolved.append(a)
        return real(*a)

    monkeypatch.setattr(sinks.manifest_cache, "resolve_reader", counting)
    sinks.manifest_cache._ResolvedAvroFile._resolved.clear()

    for m in manifests:
        for discard in (True, False):
            ours = _fetch_entries(m, io, discard)
            theirs = m.fetch_manifest_entry(io, discard)
            assert [(e.status, e.snapshot_id, e.data_file.file_path, e.data_file.record_count) for e in ours] == [
                (e.status, e.snapshot_id, e.data_file.file_path, e.data_file.record_count) for e in theirs
            ]
            assert ours == theirs
    assert len(resolved) == 1  # one header schema: one reader tree for six reads

    list_path = f"file://{tmp_path}/snap.avro"
    with write_manifest_list(2, io.new_output(list_path), 7, None, 1, "deflate") as w:
        w.add_manifests(manifests)
    snapshot = Snapshot(
        snapshot_id=7, sequence_number=1, timestamp_ms=1, manifest_list=list_path, summary=Summary(Operation.APPEND)
    )
    lists = _ListCache()
    assert lists.manifests(snapshot, io) == snapshot.manifests(io)
    assert [m.sequence_number for m in lists.manifests(snapshot, io)] == [1, 1, 1]
    assert lists.reads == 1 and len(resolved) == 2
