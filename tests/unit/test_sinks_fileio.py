"""Small files (a small flush's Parquet files, manifests, manifest lists, metadata JSON) are
created with one open and one write, and hold what the streamed writes held."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.metadata import new_table_metadata

from sinks import fileio
from sinks.rowdelta import write_data_files_with_rows
from sinks.tables import COMMON, arrow_schema, table_properties


def _os_calls(monkeypatch: Any, under: Path) -> dict[str, list[str]]:
    """The files under ``under`` opened by ``os.open``, and those written by each ``os.write``;
    and the pyarrow output streams opened there (each with its own buffer)."""
    calls: dict[str, list[str]] = {"open": [], "write": [], "stream": []}
    fds: dict[int, str] = {}
    real_open, real_write = os.open, os.write

    def opening(path: Any, flags: int, *a: Any, **kw: Any) -> int:
        fd = real_open(path, flags, *a, **kw)
        if str(path).startswith(str(under)):
            calls["open"].append(str(path))
            fds[fd] = str(path)
        return fd

    def writing(fd: int, data: Any) -> int:
        if fd in fds:
            calls["write"].append(fds[fd])
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "write", writing)
    real_stream = fileio._open

    def streaming(fs: Any, path: str, buffer_size: int) -> Any:
        calls["stream"].append(path)
        return real_stream(fs, path, buffer_size)

    monkeypatch.setattr(fileio, "_open", streaming)
    return calls


def _metadata(tmp_path: Path) -> Any:
    return new_table_metadata(
        COMMON.schema, COMMON.spec_with(4), COMMON.sort_order, f"file://{tmp_path}/t", table_properties(1 << 20)
    )


def _rows(n: int) -> pa.Table:
    """``n`` rows of ``entity_common`` over two types (two partitions' worth of buckets)."""
    now = datetime(2026, 12, 1, tzinfo=UTC)
    schema = arrow_schema(COMMON.schema)
    values = {
        "object_type_id": lambda i: ("person", "place")[i % 2],
        "object_pk": lambda i: f"k{i:05d}",
        "version": lambda i: i,
        "properties": lambda i: None if i % 4 == 0 else f'{{"n": {i}}}',
        "deleted": lambda i: i % 5 == 0,
        "updated_at": lambda i: now,
        "committed_at": lambda i: now,
        "event_id": lambda i: f"e{i}",
        "batch_id": lambda i: "b",
        "schema_version": lambda i: 0,
    }
    return pa.table([pa.array([values[f.name](i) for i in range(n)], f.type) for f in schema], schema=schema)


def test_a_small_data_file_is_created_with_one_open_and_one_write(tmp_path: Path, monkeypatch: Any) -> None:
    # Each file was opened as a pyarrow stream with a 1 MiB buffer and written by the Parquet writer
    # in pieces (failed before: 0 os-level opens, 8 streams for 8 files).
    metadata = _metadata(tmp_path)
    write_data_files_with_rows(metadata, _rows(40), PyArrowFileIO())  # the partition directories exist
    calls = _os_calls(monkeypatch, tmp_path)
    written = write_data_files_with_rows(metadata, _rows(40), PyArrowFileIO())
    paths = sorted(f.file_path.removeprefix("file://") for f, _ in written)
    assert len(paths) == 8
    assert sorted(calls["open"]) == paths and sorted(calls["write"]) == paths and calls["stream"] == []
    for f, rows in written:
        path = f.file_path.removeprefix("file://")
        assert f.file_size_in_bytes == Path(path).stat().st_size
        assert pq.read_table(path).equals(rows)


def test_a_large_data_file_is_still_streamed(tmp_path: Path, monkeypatch: Any) -> None:
    # Above the in-memory bound a file is not held whole in memory before it is written.
    from sinks import datafiles

    monkeypatch.setattr(datafiles, "IN_MEMORY_MAX_BYTES", 0)
    metadata = _metadata(tmp_path)
    write_data_files_with_rows(metadata, _rows(40), PyArrowFileIO())  # the partition directories exist
    calls = _os_calls(monkeypatch, tmp_path)
    written = write_data_files_with_rows(metadata, _rows(40), PyArrowFileIO())
    assert len(calls["stream"]) == len(written) == 8 and calls["open"] == []
    for f, rows in written:
        path = f.file_path.removeprefix("file://")
        assert f.file_size_in_bytes == Path(path).stat().st_size
        assert pq.read_table(path).equals(rows)


def test_a_manifest_is_created_with_one_open_and_one_write(tmp_path: Path, monkeypatch: Any) -> None:
    # A manifest's header went to a buffered pyarrow stream piece by piece, its block after it
    # (failed before: 0 os-level opens, 1 stream).
    from sinks.manifest_write import ManifestWriter
    from sinks.rowdelta import write_data_files

    metadata = _metadata(tmp_path)
    entries = [
        ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=7, data_file=f, sequence_number=None)
        for f in write_data_files(metadata, _rows(40), PyArrowFileIO())
    ]
    (tmp_path / "metadata").mkdir()
    location = f"file://{tmp_path}/metadata/m.avro"
    calls = _os_calls(monkeypatch, tmp_path)
    writer = ManifestWriter(
        metadata.spec(),
        metadata.schema(),
        fileio.SizedOutputFile(PyArrowFileIO(), location),
        7,
        "deflate",
        ManifestContent.DATA,
    )
    with writer:
        for e in entries:
            writer.add(e)
    manifest = writer.to_manifest_file()
    path = str(tmp_path / "metadata/m.avro")
    assert calls == {"open": [path], "write": [path], "stream": []}
    assert manifest.manifest_length == Path(path).stat().st_size
    read = manifest.fetch_manifest_entry(PyArrowFileIO())
    assert [e.data_file.file_path for e in read] == [e.data_file.file_path for e in entries]


def test_table_metadata_json_is_created_with_one_open_and_one_write(tmp_path: Path, monkeypatch: Any) -> None:
    # Failed before: 0 os-level opens, 1 buffered stream per metadata file.
    from pyiceberg.serializers import FromInputFile

    from sinks.catalog import NessieCatalog

    metadata = _metadata(tmp_path)
    (tmp_path / "t/metadata").mkdir(parents=True)
    calls = _os_calls(monkeypatch, tmp_path)
    NessieCatalog._write_metadata(metadata, PyArrowFileIO(), f"file://{tmp_path}/t/metadata/00001-a.metadata.json")
    path = str(tmp_path / "t/metadata/00001-a.metadata.json")
    assert calls == {"open": [path], "write": [path], "stream": []}
    assert FromInputFile.table_metadata(PyArrowFileIO().new_input(f"file://{path}")) == metadata


def test_write_file_creates_a_missing_directory_and_overwrites(tmp_path: Path) -> None:
    io = PyArrowFileIO()
    location = f"file://{tmp_path}/a/b/c.bin"
    assert fileio.write_file(io, location, b"first, longer") == 13
    assert fileio.write_file(io, location, memoryview(b"second")) == 6
    assert (tmp_path / "a/b/c.bin").read_bytes() == b"second"


def test_files_of_one_directory_parse_its_location_once_and_get_pyicebergs_paths(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # A commit writes ~15 files into a few directories per table; pyiceberg's parse_location
    # parsed every file's whole URI (~11 µs each). Failed before: 3 parses for 3 files of one
    # directory.
    pyicebergs = PyArrowFileIO.parse_location
    io = PyArrowFileIO()
    parses: list[str] = []

    def counting(location: str, properties: Any = None) -> Any:
        parses.append(location)
        return pyicebergs(location, properties or {})

    monkeypatch.setattr(PyArrowFileIO, "parse_location", staticmethod(counting))
    for name in ("a.parquet", "b.avro", "c.metadata.json"):
        fileio.write_file(io, f"file://{tmp_path}/same/{name}", b"x")
    assert len(parses) == 1
    assert sorted(p.name for p in (tmp_path / "same").iterdir()) == ["a.parquet", "b.avro", "c.metadata.json"]
    # The same (scheme, netloc, path) as pyiceberg's, also where a location is not a plain
    # directory and name (no scheme, a query, a fragment, parameters, dot segments): pyiceberg's.
    for location in (
        "file:///tmp/wh/db/t_1/metadata/snap-1-0-x.avro",
        "file:///name.json",
        "s3://bucket/wh/db/t/data/type=person/00000-0-x.parquet",
        "s3://bucket/x.parquet",
        "s3://bucket//double/x.parquet",
        "hdfs://nn:8020/wh/t/metadata/v1.metadata.json",
        "gs://b/a b/ü.parquet",
        "/tmp/absolute/x.parquet",
        "relative/x.parquet",
        "s3://bucket/wh/x.parquet?versionId=3",
        "s3://bucket/wh/x#frag",
        "s3://bucket/wh;p/x;q",
        "s3://bucket/wh/..",
        "s3://bucket/wh/",
        "/tmp/a://b/x.parquet",
        "rel/a://b/x.parquet",
    ):
        for _ in range(2):  # the second from the kept directory
            assert fileio.parse_location(location, io.properties) == pyicebergs(location, io.properties), location


def test_a_local_path_holding_a_scheme_separator_is_pyicebergs_whatever_was_parsed_before() -> None:
    # ``/tmp/a://b`` is a local path: pyiceberg gives it the properties' default scheme. Failed
    # before: the directory's first parse was kept and returned under other properties.
    location = "/tmp/a://b/x.parquet"
    other = {"DEFAULT_SCHEME": "s3", "DEFAULT_NETLOC": "n"}
    assert fileio.parse_location(location, other) == PyArrowFileIO.parse_location(location, other)
    assert fileio.parse_location(location, {}) == PyArrowFileIO.parse_location(location, {})
    assert fileio.parse_location(location, {})[0] == "file"
