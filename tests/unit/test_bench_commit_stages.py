"""The stage timer's count of the files a commit creates, by table and kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.partitioning import PartitionSpec

from bench.commit_stages import StageTimer, file_kind


def test_a_commits_files_are_told_apart_by_table_and_kind() -> None:
    base = "file:///w/causeway/entity_common_1b2c/"
    assert file_kind(base + "data/object_type_id=a/00000-0-9f.parquet") == ("entity_common", "data")
    assert file_kind(base + "data/delete-4e5f.parquet") == ("entity_common", "delete")
    assert file_kind(base + "metadata/3c1d-m0.avro") == ("entity_common", "manifest")
    assert file_kind(base + "metadata/snap-123-0-3c1d.avro") == ("entity_common", "manifest list")
    assert file_kind(base + "metadata/00007-ab.metadata.json") == ("entity_common", "metadata")
    assert file_kind("file:///w/causeway/entity_edge/data/x.parquet") == ("entity_edge", "data")
    assert file_kind("file:///w/causeway/entity_events/data/x.parquet") == ("entity_events", "data")


def test_files_written_while_installed_are_counted_once_each(tmp_path: Path) -> None:
    from pyiceberg.io import load_file_io

    from sinks import fileio

    io = load_file_io({}, f"file://{tmp_path}")
    timer = StageTimer()
    with timer.installed():
        fileio.write_file(io, f"file://{tmp_path}/entity_edge/metadata/00001-a.metadata.json", b"{}")
        with fileio.SizedOutputFile(io, f"file://{tmp_path}/entity_edge/metadata/m-m0.avro").create() as out:
            out.write(b"x")
    fileio.write_file(io, f"file://{tmp_path}/entity_edge/metadata/00002-a.metadata.json", b"{}")  # not installed
    assert dict(timer.files) == {("entity_edge", "metadata"): 1, ("entity_edge", "manifest"): 1}
    assert "| entity_edge | 0.00 | 0.00 | 0.50 | 0.00 | 0.50 | 1.00 |" in timer.files_table(2)


def test_a_data_file_written_through_the_writer_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sinks.datafiles`` binds ``write_file`` by name: imported after the patch it counted twice."""
    import sys

    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
    from pyiceberg.types import LongType, NestedField

    import sinks
    from sinks import fileio

    # First imported while the timer is being installed. Both the module table's entry and the
    # package's attribute come back after the test: restoring the entry alone left ``sinks.datafiles``
    # naming the fresh copy, so later tests patched a module the writers do not use.
    monkeypatch.delitem(sys.modules, "sinks.datafiles", raising=False)
    monkeypatch.delattr(sinks, "datafiles", raising=False)
    schema = Schema(NestedField(1, "n", LongType(), required=False))
    metadata = new_table_metadata(schema, PartitionSpec(), UNSORTED_SORT_ORDER, f"file://{tmp_path}/entity_edge", {})
    io = fileio.file_io({}, f"file://{tmp_path}")
    timer = StageTimer()
    with timer.installed():
        from sinks.rowdelta import write_data_files

        (written,) = write_data_files(metadata, pa.table({"n": pa.array([1, 2], pa.int64())}), io)
    assert written.record_count == 2
    assert dict(timer.files) == {("entity_edge", "data"): 1}
