"""Manifests and manifest lists as sinks/manifest_write.py writes them: pyiceberg's bytes, its Avro
set-up kept and its records encoded in one pass."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.resolver import resolve_writer
from pyiceberg.avro.writer import IntegerWriter
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
)
from pyiceberg.table.metadata import new_table_metadata

from sinks.manifest_write import BlockEncoder, ManifestWriter, _IntMapWriter, _list_setup
from sinks.rowdelta import write_data_files
from sinks.tables import COMMON, arrow_schema, table_properties
from tests.calls import count_calls


def _entries(tmp_path: Path, n: int) -> tuple[Any, list[ManifestEntry]]:
    metadata = new_table_metadata(
        COMMON.schema, COMMON.spec_with(4), COMMON.sort_order, f"file://{tmp_path}/t", table_properties(1 << 20)
    )
    now = datetime(2026, 12, 1, tzinfo=UTC)
    columns: dict[str, list[Any]] = {
        "object_type_id": [("person", "place")[i % 2] for i in range(n)],
        "object_pk": [f"k{i:05d}" + "é" * (i % 30) for i in range(n)],
        "version": [-i if i % 3 else 2**40 + i for i in range(n)],  # negative and wide longs
        "properties": [None if i % 4 == 0 else f'{{"n": {i}}}' for i in range(n)],
        "deleted": [i % 5 == 0 for i in range(n)],
        "updated_at": [now] * n,
        "committed_at": [now] * n,
        "event_id": [f"e{i}" for i in range(n)],
        "batch_id": ["b"] * n,
        "schema_version": [0] * n,
    }
    rows = pa.Table.from_pydict(columns, schema=arrow_schema(COMMON.schema))
    files = write_data_files(metadata, rows, PyArrowFileIO())
    entries = [
        ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=7, data_file=f, sequence_number=None)
        for f in files
    ]
    return metadata, entries


def _manifest(tmp_path: Path, metadata: Any, entries: list[ManifestEntry]) -> ManifestWriter:
    writer = ManifestWriter(
        metadata.spec(),
        metadata.schema(),
        PyArrowFileIO().new_output(f"file://{tmp_path}/m.avro"),
        7,
        "deflate",
        ManifestContent.DATA,
    )
    with writer:
        for e in entries:
            writer.add(e)
    return writer


def _pyiceberg_bytes(tree: Any, records: list[Any]) -> bytes:
    out = io.BytesIO()
    encoder = BinaryEncoder(out)
    for r in records:
        tree.write(encoder, r)
    return out.getvalue()


def _block_bytes(tree: Any, records: list[Any]) -> bytes:
    encoder = BlockEncoder()
    for r in records:
        tree.write(encoder, r)
    return bytes(encoder.buffer)


@pytest.mark.parametrize(
    "value", [0, 1, -1, 63, 64, -64, -65, 127, 128, 8191, 8192, 2**31 - 1, -(2**31), 2**40, 2**63 - 1, -(2**63)]
)
def test_a_long_is_the_varint_pyiceberg_writes(value: int) -> None:
    out = io.BytesIO()
    BinaryEncoder(out).write_int(value)
    ours = BlockEncoder()
    ours.write_int(value)
    assert bytes(ours.buffer) == out.getvalue()


def test_manifest_entries_and_list_records_encode_to_pyiceberg_bytes(tmp_path: Path) -> None:
    metadata, entries = _entries(tmp_path, 120)
    writer = _manifest(tmp_path, metadata, entries)
    manifest = writer.to_manifest_file()
    ours = writer._writer.writer  # noqa: SLF001 - the writer tree the file was written with
    theirs = resolve_writer(
        record_schema=writer._with_partition(DEFAULT_READ_VERSION), file_schema=writer._with_partition(2)
    )
    assert ours != theirs  # the metrics maps have their own writer
    assert _block_bytes(ours, writer.entries) == _pyiceberg_bytes(theirs, writer.entries)
    _, list_ours, _, _ = _list_setup(2)
    list_theirs = resolve_writer(
        record_schema=MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION], file_schema=MANIFEST_LIST_FILE_SCHEMAS[2]
    )
    manifest.sequence_number = manifest.min_sequence_number = 3
    assert _block_bytes(list_ours, [manifest] * 3) == _pyiceberg_bytes(list_theirs, [manifest] * 3)
    # pyiceberg reads the file back as written.
    read = manifest.fetch_manifest_entry(PyArrowFileIO())
    assert [e.data_file.file_path for e in read] == [e.data_file.file_path for e in entries]
    assert [e.data_file.lower_bounds for e in read] == [e.data_file.lower_bounds for e in entries]


def test_a_manifest_is_written_in_a_few_stream_writes_without_a_writer_call_per_metric(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # pyiceberg's encoder wrote every byte of every varint as its own write, and its MapWriter
    # called a key writer and a value writer for every entry of an entry's six int-keyed metrics
    # maps (sizes, counts, bounds; a value per column): ~4,600 writes a 10-event commit. Failed
    # before: 1,400 stream writes and 696 integer writer calls for these 8 entries.
    metadata, entries = _entries(tmp_path, 40)
    writes = count_calls(monkeypatch, BinaryEncoder, "write")
    longs = count_calls(monkeypatch, IntegerWriter, "write")
    _manifest(tmp_path, metadata, entries)
    assert len(entries) == 8
    assert len(writes) < 100  # the header's and the block's
    assert len(longs) <= 10 * len(entries)  # the entry's own longs (snapshot id, record count, size, ...)


def test_a_data_file_is_encoded_once_and_its_bytes_reused_when_a_later_manifest_keeps_or_deletes_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # A commit that removes a file rewrites every entry of its manifest as EXISTING (or DELETED):
    # the data_file struct of those entries is the same bytes as when it was added. Failed before:
    # every rewrite encoded every entry's metrics maps again (6 map writes an entry).
    metadata, entries = _entries(tmp_path, 120)
    writer = _manifest(tmp_path, metadata, entries)
    ours = writer._writer.writer  # noqa: SLF001 - the writer tree the file was written with
    theirs = resolve_writer(
        record_schema=writer._with_partition(DEFAULT_READ_VERSION), file_schema=writer._with_partition(2)
    )
    later = [
        ManifestEntry.from_args(
            status=(ManifestEntryStatus.EXISTING, ManifestEntryStatus.DELETED)[i % 2],
            snapshot_id=7,
            sequence_number=3 + i,
            file_sequence_number=3 + i,
            data_file=e.data_file,
        )
        for i, e in enumerate(entries)
    ]
    maps = count_calls(monkeypatch, _IntMapWriter, "write")
    assert _block_bytes(ours, later) == _pyiceberg_bytes(theirs, later)
    assert maps == []


def test_a_tables_manifests_serialise_its_schema_once(tmp_path: Path, monkeypatch: Any) -> None:
    # pyiceberg serialised the table schema into every manifest's header; a world's commits write
    # its tables' manifests with the same schema and spec objects (the kept metadata), so once is
    # enough. Failed before: 3 schema dumps for 3 manifests.
    from pyiceberg.manifest import ManifestWriterV2
    from pyiceberg.schema import Schema

    metadata, entries = _entries(tmp_path, 40)
    expected_meta = ManifestWriterV2(
        metadata.spec(), metadata.schema(), PyArrowFileIO().new_output(f"file://{tmp_path}/x.avro"), 7, "deflate"
    )._meta
    _manifest(tmp_path, metadata, entries)
    dumps = count_calls(monkeypatch, Schema, "model_dump_json")
    writers = [_manifest(tmp_path, metadata, entries) for _ in range(3)]
    assert len(dumps) == 0
    # The header's metadata is pyiceberg's, keys in order.
    assert list(writers[0]._meta.items()) == list(expected_meta.items())  # noqa: SLF001
    # Another table's schema, however alike, is its own.
    other, _ = _entries(tmp_path / "other", 8)
    _manifest(tmp_path / "other", other, entries)
    assert len(dumps) == 1


def test_a_listed_manifest_is_encoded_once_and_the_next_list_reuses_its_bytes(tmp_path: Path, monkeypatch: Any) -> None:
    # A table's manifest list repeats the previous list's manifests (the same objects, the manifest
    # cache's) in every commit; only the one to three a commit writes are new. Failed before: the
    # second list encoded both manifests again (their struct writers called as for the first list).
    from pyiceberg.avro.writer import StructWriter
    from pyiceberg.manifest import UNASSIGNED_SEQ, ManifestFile, read_manifest_list

    from sinks.manifest_write import ManifestListWriter

    metadata, entries = _entries(tmp_path, 40)
    kept = _manifest(tmp_path, metadata, entries).to_manifest_file()
    kept.sequence_number = kept.min_sequence_number = 3  # listed by an earlier snapshot
    new = _manifest(tmp_path, metadata, entries).to_manifest_file()
    assert new.sequence_number == UNASSIGNED_SEQ  # written by this commit (snapshot 7)
    theirs = resolve_writer(
        record_schema=MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION], file_schema=MANIFEST_LIST_FILE_SCHEMAS[2]
    )

    def write_list(name: str, snapshot_id: int, sequence_number: int) -> Any:
        out = PyArrowFileIO().new_output(f"file://{tmp_path}/{name}")
        with ManifestListWriter(out, snapshot_id, 6, sequence_number, "deflate") as writer:
            writer.add_manifests([kept, new])
        return writer

    first = write_list("snap-1.avro", 7, 5)
    assert (new.sequence_number, new.min_sequence_number) == (5, 5)  # assigned on the manifest itself
    structs = count_calls(monkeypatch, StructWriter, "write")

    def listed_encoded() -> list[Any]:  # the list's records, not its header's
        return [call for call in structs if isinstance(call[2], ManifestFile)]

    second = write_list("snap-2.avro", 8, 6)
    assert listed_encoded() == []
    # The same bytes pyiceberg's writer gives, and pyiceberg reads both lists back as listed.
    for writer in (first, second):
        assert _block_bytes(writer._writer.writer, [kept, new]) == _pyiceberg_bytes(theirs, [kept, new])  # noqa: SLF001
    for name in ("snap-1.avro", "snap-2.avro"):
        listed = list(read_manifest_list(PyArrowFileIO().new_input(f"file://{tmp_path}/{name}")))
        assert listed == [kept, new]
        assert [(m.sequence_number, m.min_sequence_number) for m in listed] == [(3, 3), (5, 5)]
    # A sequence number assigned after the bytes were kept is encoded again, not taken from them.
    new.min_sequence_number = 4
    structs.clear()
    assert _block_bytes(first._writer.writer, [new]) == _pyiceberg_bytes(theirs, [new])  # noqa: SLF001
    assert listed_encoded() != []


def test_a_manifest_and_a_list_are_pyicebergs_bytes_written_as_one_header_and_one_block(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # pyiceberg's encoder wrote the header's every varint byte, and the block's count and length,
    # as writes of their own (~40 a file; 7 Avro files a 3-table commit); a manifest's header is the
    # same for every manifest of its (schema, spec, content) but its sync marker. Failed before:
    # 40 stream writes for the manifest.
    import os

    from pyiceberg.manifest import ManifestListWriterV2, ManifestWriterV2

    from sinks.manifest_write import ManifestListWriter

    monkeypatch.setattr(os, "urandom", lambda n: bytes(range(n)))  # one sync marker for both writers
    metadata, entries = _entries(tmp_path, 4)
    entries = entries[:1]  # pyiceberg writes a block per entry: one entry, one block, as ours
    _manifest(tmp_path, metadata, entries)  # the set-up (and its header) kept
    writes = count_calls(monkeypatch, BinaryEncoder, "write")
    ours = _manifest(tmp_path, metadata, entries).to_manifest_file()
    assert len(writes) == 2
    theirs = ManifestWriterV2(
        metadata.spec(), metadata.schema(), PyArrowFileIO().new_output(f"file://{tmp_path}/theirs.avro"), 7, "deflate"
    )
    with theirs:
        for e in entries:
            theirs.add(e)
    assert (tmp_path / "m.avro").read_bytes() == (tmp_path / "theirs.avro").read_bytes()

    ours.sequence_number = ours.min_sequence_number = 3
    writes.clear()
    for name, cls in (("list.avro", ManifestListWriter), ("list-theirs.avro", ManifestListWriterV2)):
        with cls(PyArrowFileIO().new_output(f"file://{tmp_path}/{name}"), 8, 7, 4, "deflate") as writer:
            writer.add_manifests([ours, ours])
        if cls is ManifestListWriter:
            assert len(writes) == 2
    assert (tmp_path / "list.avro").read_bytes() == (tmp_path / "list-theirs.avro").read_bytes()


def test_a_new_data_files_metrics_maps_are_encoded_without_a_call_per_long(tmp_path: Path, monkeypatch: Any) -> None:
    # A new data file's first encoding (each data file is encoded once, then its bytes kept) was
    # mostly its six int-keyed metrics maps: a key and a value per column, each long a varint
    # loop in a method call (~130 a file, ~40 % of the ~65 µs an entry). Failed before: 1,096
    # ``write_int`` calls for 8 new entries (218 after); the maps append small longs from a table.
    metadata, entries = _entries(tmp_path, 40)
    longs = count_calls(monkeypatch, BlockEncoder, "write_int")
    writer = _manifest(tmp_path, metadata, entries)
    assert len(entries) == 8
    assert len(longs) <= 30 * len(entries)  # the entry's own fields (ids, counts, string lengths) and the block
    theirs = resolve_writer(
        record_schema=writer._with_partition(DEFAULT_READ_VERSION), file_schema=writer._with_partition(2)
    )
    assert _block_bytes(writer._writer.writer, writer.entries) == _pyiceberg_bytes(theirs, writer.entries)  # noqa: SLF001


@pytest.mark.parametrize("binary", [False, True])
def test_a_metrics_map_is_the_bytes_pyicebergs_map_writer_writes_for_any_long(binary: bool) -> None:
    from pyiceberg.avro.writer import BinaryWriter, MapWriter

    longs = [0, 1, 63, 64, 8191, 8192, 2**40, 2**63 - 1, -1, -64, -65, -(2**63)]
    if binary:
        val: dict[int, Any] = {i: bytes(n % 300) * (1 + n // 300) for i, n in enumerate([0, 1, 5, 8191, 8192, 9000])}
        val[10**6] = b"x"
    else:
        val = {k: v for k, v in zip([*longs[:8], 9000, 10**6, 3, 4], longs, strict=True)}
    theirs = MapWriter(IntegerWriter(), BinaryWriter() if binary else IntegerWriter())
    ours = _IntMapWriter(binary)
    assert _block_bytes(ours, [val, {}]) == _pyiceberg_bytes(theirs, [val, {}])


def test_a_tables_manifests_build_its_partition_type_once_and_summarise_as_pyiceberg(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # pyiceberg's to_manifest_file built the spec's partition type (pydantic models, ~26-36 µs)
    # for every manifest's partition summaries; a world's commits write ~4 manifests with the
    # same schema and spec objects. Failed before: 3 partition types for 3 manifests.
    from pyiceberg.manifest import ManifestWriterV2
    from pyiceberg.partitioning import PartitionSpec

    metadata, entries = _entries(tmp_path, 40)
    _manifest(tmp_path, metadata, entries).to_manifest_file()
    types = count_calls(monkeypatch, PartitionSpec, "partition_type")
    ours = [_manifest(tmp_path, metadata, entries).to_manifest_file() for _ in range(3)]
    assert types == []
    theirs = ManifestWriterV2(
        metadata.spec(), metadata.schema(), PyArrowFileIO().new_output(f"file://{tmp_path}/p.avro"), 7, "deflate"
    )
    with theirs:
        for e in entries:
            theirs.add(e)
    expected = theirs.to_manifest_file()
    for got in ours:
        assert got.partitions == expected.partitions and got.partition_spec_id == expected.partition_spec_id
        assert (got.added_files_count, got.added_rows_count) == (expected.added_files_count, expected.added_rows_count)
