"""NessieCatalog.begin with tables to read: the head and their contents in one round trip (no Nessie)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sinks.catalog import NessieCatalog, ReadOnlyReference
from sinks.nessie import IcebergTable, Reference


class OneCall:
    """A client that answers only the combined contents call, and records what was asked."""

    def __init__(self, ref_type: str = "BRANCH") -> None:
        self.ref_type = ref_type
        self.calls: list[tuple[str, list[tuple[str, ...]]]] = []

    def get_contents_and_reference(
        self, ref: str, keys: list[tuple[str, ...]]
    ) -> tuple[dict[tuple[str, ...], IcebergTable], Reference]:
        self.calls.append((ref, keys))
        return {keys[0]: IcebergTable("file:///m.json", id="c1")}, Reference(ref, self.ref_type, "h1")  # type: ignore[arg-type]


def test_begin_pins_the_hash_the_contents_were_read_at_and_keeps_them(tmp_path: Path) -> None:
    client = OneCall()
    cat = NessieCatalog(client=client, ref="world-a", warehouse=f"file://{tmp_path}")  # type: ignore[arg-type]
    cat.reading([("onto", "entity_events"), ("onto", "entity_edge")])
    assert cat.begin() == "h1" and cat.base_hash == "h1" and cat.read_ref == "world-a@h1"
    cat.prefetch([("onto", "entity_events"), ("onto", "entity_edge")])  # already read: no call
    assert client.calls == [("world-a", [("onto", "entity_events"), ("onto", "entity_edge")])]
    assert cat._content(("onto", "entity_edge")) is None  # absent at that commit, and not asked again
    assert len(client.calls) == 1


def test_begin_with_tables_to_read_refuses_a_tag(tmp_path: Path) -> None:
    cat = NessieCatalog(client=OneCall("TAG"), ref="v1", warehouse=f"file://{tmp_path}")  # type: ignore[arg-type]
    with pytest.raises(ReadOnlyReference):
        cat.reading([("onto", "entity_events")]).begin()
    assert not cat.staging


def test_writing_table_metadata_reads_pyiceberg_configuration_once_per_process(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # pyiceberg's metadata writer read ~/.pyiceberg.yaml and the environment for every file: three
    # tables a commit (failed before: one Config per file written).
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.utils import config

    from sinks.tables import COMMON, table_properties

    metadata = new_table_metadata(
        COMMON.schema, COMMON.spec_with(4), COMMON.sort_order, f"file://{tmp_path}/t", table_properties(1 << 20)
    )
    io = PyArrowFileIO()
    NessieCatalog._write_metadata(metadata, io, f"file://{tmp_path}/t/metadata/00000-a.metadata.json")
    made: list[object] = []
    real = config.Config.__init__

    def counting(self: Any) -> None:
        made.append(self)
        real(self)

    monkeypatch.setattr(config.Config, "__init__", counting)
    for n in range(3):
        NessieCatalog._write_metadata(metadata, io, f"file://{tmp_path}/t/metadata/0000{n + 1}-a.metadata.json")
    assert made == []
    # The file is what pyiceberg writes and reads: no current snapshot is left out, not written as -1.
    from pyiceberg.serializers import FromInputFile, ToOutputFile

    ToOutputFile.table_metadata(metadata, io.new_output(f"file://{tmp_path}/t/metadata/theirs.metadata.json"))
    ours = (tmp_path / "t/metadata/00001-a.metadata.json").read_bytes()
    assert ours == (tmp_path / "t/metadata/theirs.metadata.json").read_bytes()
    assert FromInputFile.table_metadata(io.new_input(f"file://{tmp_path}/t/metadata/00001-a.metadata.json")) == metadata


def test_tables_share_one_file_io_and_its_filesystem(tmp_path: Path, monkeypatch: Any) -> None:
    # pyiceberg's catalog built a FileIO for every table load and commit, and each FileIO its own
    # filesystem on first use (an S3 client for s3://): failed before, 3 FileIOs for 3 loads.
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from sinks import fileio
    from tests.calls import count_calls

    monkeypatch.setattr(fileio, "_IOS", {}, raising=False)
    built = count_calls(monkeypatch, PyArrowFileIO, "__init__")
    cat = NessieCatalog(client=OneCall(), ref="world-a", warehouse=f"file://{tmp_path}")  # type: ignore[arg-type]
    ios = {id(cat._load_file_io({"write.x": "1"}, f"file://{tmp_path}/t{i}/metadata/m.json")) for i in range(3)}
    assert len(ios) == 1 and len(built) == 1
    # Other properties (another table's S3 settings) or another scheme get their own.
    cat._load_file_io({"write.x": "2"}, f"file://{tmp_path}/t/metadata/m.json")
    cat._load_file_io({"write.x": "1"}, "s3://b/t/metadata/m.json")
    assert len(built) == 3


def test_a_commit_reuses_the_file_io_although_the_offset_map_changed(tmp_path: Path, monkeypatch: Any) -> None:
    # The FileIO was keyed by every table property, and entity_events' committed-offset map (a
    # table property) changes with every commit: each commit built a new FileIO and, on first use,
    # its filesystem. Failed before: 3 FileIOs for 3 commits' property sets.
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from sinks import fileio
    from sinks.tables import OFFSETS_PROPERTY, TRUNCATED_PROPERTY
    from tests.calls import count_calls

    monkeypatch.setattr(fileio, "_IOS", {}, raising=False)
    built = count_calls(monkeypatch, PyArrowFileIO, "__init__")
    cat = NessieCatalog(client=OneCall(), ref="world-a", warehouse=f"file://{tmp_path}")  # type: ignore[arg-type]
    location = f"file://{tmp_path}/t/metadata/m.json"
    table_properties = [
        {"write.x": "1", OFFSETS_PROPERTY: f'{{"t/0":"0-{n}"}}', TRUNCATED_PROPERTY: str(n)} for n in range(3)
    ]
    ios = {id(cat._load_file_io(props, location)) for props in table_properties}
    assert len(ios) == 1 and len(built) == 1
    io = next(iter(fileio._IOS.values()))
    assert OFFSETS_PROPERTY not in io.properties and io.properties["write.x"] == "1"


def test_table_metadata_is_written_without_a_stat_or_a_directory_call(tmp_path: Path) -> None:
    # pyiceberg's create(overwrite=False) stat'ed the new name and ran a recursive create_dir of
    # the metadata directory for every file, three a commit (failed before: 3 of each for 3 files).
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.serializers import FromInputFile
    from pyiceberg.table.metadata import new_table_metadata

    from sinks.tables import COMMON, table_properties
    from tests.calls import counting_local_fs

    metadata = new_table_metadata(
        COMMON.schema, COMMON.spec_with(4), COMMON.sort_order, f"file://{tmp_path}/t", table_properties(1 << 20)
    )
    io = PyArrowFileIO()
    fs, counts = counting_local_fs()
    io.fs_by_scheme = lambda scheme, netloc: fs  # type: ignore[method-assign]
    NessieCatalog._write_metadata(metadata, io, f"file://{tmp_path}/t/metadata/00000-a.metadata.json")
    assert counts == {"create_dir": 1, "get_file_info": 0}  # the new metadata directory
    counts.update(create_dir=0)
    for n in range(3):
        NessieCatalog._write_metadata(metadata, io, f"file://{tmp_path}/t/metadata/0000{n + 1}-a.metadata.json")
    assert counts == {"create_dir": 0, "get_file_info": 0}
    assert FromInputFile.table_metadata(io.new_input(f"file://{tmp_path}/t/metadata/00003-a.metadata.json")) == metadata
