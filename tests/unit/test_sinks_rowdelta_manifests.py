"""What a RowDelta writes (sinks/rowdelta.py, sinks/manifest_write.py): manifests pyiceberg reads
back as written, handed to the manifest cache so the next flush reads none of them again."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestEntry
from pyiceberg.table import StaticTable, Table
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.snapshots import Operation

from sinks import manifest_cache
from sinks.rowdelta import RowDelta, write_data_files
from sinks.tables import COMMON, arrow_schema, table_properties
from tests.calls import count_calls


def _table(tmp_path: Path) -> Table:
    metadata = new_table_metadata(
        COMMON.schema, COMMON.spec_with(4), COMMON.sort_order, f"file://{tmp_path}/t", table_properties(1 << 20)
    )
    return StaticTable(("ns", "t"), metadata, f"file://{tmp_path}/t/metadata/v0.json", PyArrowFileIO(), None)  # type: ignore[arg-type]


def _one_snapshot(tmp_path: Path, properties: dict[str, str] | None = None) -> tuple[Table, Any, list[Any]]:
    """A table, its open transaction, and the data files of the one snapshot committed in it."""
    table = _table(tmp_path)
    tx = table.transaction()
    first = write_data_files(tx.table_metadata, _rows(40), table.io)
    RowDelta(tx, snapshot_properties=properties).add(first).commit()
    return table, tx, first


def _rows(n: int, start: int = 0) -> pa.Table:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    return pa.Table.from_pylist(
        [
            {
                "object_type_id": ("person", "place")[i % 2],
                "object_pk": f"k{i:05d}",
                "version": 1,
                "properties": f'{{"n": {i}}}',
                "deleted": False,
                "updated_at": now,
                "committed_at": now,
                "event_id": f"e{i}",
                "batch_id": "b",
                "schema_version": 0,
            }
            for i in range(start, start + n)
        ],
        schema=arrow_schema(COMMON.schema),
    )


def _summary(e: ManifestEntry) -> tuple[Any, ...]:
    f = e.data_file
    return (
        f.file_path,
        e.status,
        e.snapshot_id,
        e.sequence_number,
        e.file_sequence_number,
        f.spec_id,
        tuple(f.partition),
        f.record_count,
        f.file_size_in_bytes,
        f.lower_bounds,
        f.upper_bounds,
        f.null_value_counts,
    )


def test_a_flush_reads_none_of_the_manifests_the_flush_before_wrote(tmp_path: Path) -> None:
    # The next flush plans from the snapshot a RowDelta just wrote: its manifest list and the
    # manifests it wrote are handed to the cache (failed before: one list read and one manifest
    # read per new manifest, ~4 Avro reads a commit).
    table = _table(tmp_path)
    tx = table.transaction()
    first = write_data_files(tx.table_metadata, _rows(40), table.io)
    RowDelta(tx).add(first).commit()
    tx2_md = tx.table_metadata
    second = write_data_files(tx2_md, _rows(40, 40), table.io)
    removed = first[0]
    RowDelta(tx).add(second).remove([removed]).commit()
    snapshot = tx.table_metadata.current_snapshot()
    assert snapshot is not None

    list_reads, misses = manifest_cache.LISTS.reads, manifest_cache.CACHE.misses
    listed = manifest_cache.manifests(snapshot, table.io)
    cached = {m.manifest_path: manifest_cache.entries(m, table.io) for m in listed}
    assert manifest_cache.LISTS.reads == list_reads
    assert manifest_cache.CACHE.misses == misses

    # ... and what the cache hands out is what pyiceberg reads from the files.
    read = snapshot.manifests(table.io)
    assert [(m.manifest_path, m.sequence_number, m.min_sequence_number, m.added_snapshot_id) for m in listed] == [
        (m.manifest_path, m.sequence_number, m.min_sequence_number, m.added_snapshot_id) for m in read
    ]
    for m in read:
        assert sorted(map(_summary, cached[m.manifest_path])) == sorted(map(_summary, m.fetch_manifest_entry(table.io)))
    live = {e.data_file.file_path for es in cached.values() for e in es}
    assert live == {f.file_path for f in first[1:] + second}


def test_only_added_data_files_commit_as_an_append(tmp_path: Path) -> None:
    # The log's append goes through RowDelta now; incremental readers take "append" snapshots.
    table = _table(tmp_path)
    tx = table.transaction()
    files = write_data_files(tx.table_metadata, _rows(10), table.io)
    RowDelta(tx).add(files).commit()
    appended = tx.table_metadata.current_snapshot()
    assert appended is not None and appended.summary is not None
    assert appended.summary.operation == Operation.APPEND
    RowDelta(tx).remove(files[:1]).commit()
    removed = tx.table_metadata.current_snapshot()
    assert removed is not None and removed.summary is not None
    assert removed.summary.operation == Operation.OVERWRITE
    # pyiceberg's own planning reads the written manifests (one Avro block each): the removed file is gone.
    after = StaticTable(table.name(), tx.table_metadata, table.metadata_location, table.io, None)  # type: ignore[arg-type]
    assert {t.file.file_path for t in after.scan().plan_files()} == {f.file_path for f in files[1:]}


def test_a_manifest_list_is_written_without_deriving_its_avro_schema_again(tmp_path: Path, monkeypatch: Any) -> None:
    # pyiceberg's manifest list writer resolved a writer tree and converted the list schema to Avro
    # JSON for every list, one list per table per commit (failed before: one conversion per commit).
    from pyiceberg.utils.schema_conversion import AvroSchemaConversion

    table = _table(tmp_path)
    tx = table.transaction()
    RowDelta(tx).add(write_data_files(tx.table_metadata, _rows(10), table.io)).commit()  # sets up the writers
    conversions: list[str] = []
    real = AvroSchemaConversion.iceberg_to_avro

    def counting(self: AvroSchemaConversion, schema: Any, schema_name: str | None = None) -> Any:
        conversions.append(str(schema_name))
        return real(self, schema, schema_name=schema_name)

    monkeypatch.setattr(AvroSchemaConversion, "iceberg_to_avro", counting)
    for start in (10, 20, 30):
        RowDelta(tx).add(write_data_files(tx.table_metadata, _rows(10, start), table.io)).commit()
    assert conversions == []
    # The lists read back as pyiceberg reads them: every snapshot's manifests, sequence numbers assigned.
    after = StaticTable(table.name(), tx.table_metadata, table.metadata_location, table.io, None)  # type: ignore[arg-type]
    snapshot = after.current_snapshot()
    assert snapshot is not None and snapshot.sequence_number == 4
    assert all(m.sequence_number is not None and m.sequence_number >= 1 for m in snapshot.manifests(table.io))
    assert sum(t.file.record_count for t in after.scan().plan_files()) == 40
    assert after.scan().to_arrow().num_rows == 40


def test_manifests_and_lists_are_written_without_a_stat_or_a_directory_call(tmp_path: Path) -> None:
    # pyiceberg's output file ran a recursive create_dir of the metadata directory before opening
    # each manifest and manifest list, and stat'ed each manifest for its length (failed before:
    # 2 create_dir and 1 stat for the second commit's manifest and list).
    from tests.calls import counting_local_fs

    table = _table(tmp_path)
    fs, counts = counting_local_fs()
    table.io.fs_by_scheme = lambda scheme, netloc: fs  # type: ignore[attr-defined]
    tx = table.transaction()
    RowDelta(tx).add(write_data_files(tx.table_metadata, _rows(10), table.io)).commit()
    files = write_data_files(tx.table_metadata, _rows(10), table.io)  # the same partitions again
    counts.update(create_dir=0, get_file_info=0)
    RowDelta(tx).add(files).commit()
    assert counts == {"create_dir": 0, "get_file_info": 0}, counts
    snapshot = tx.table_metadata.current_snapshot()
    assert snapshot is not None
    for m in snapshot.manifests(table.io):  # each length as the file is, and pyiceberg reads it
        assert m.manifest_length == Path(m.manifest_path.removeprefix("file://")).stat().st_size
        assert len(m.fetch_manifest_entry(table.io)) >= 1


def _three_flushes(table: Table, tx: Any) -> list[Any]:
    """Three flushes of 40 rows each committed in ``tx``: their data files (up to 8 partitions each)."""
    files = []
    for start in (0, 40, 80):
        written = write_data_files(tx.table_metadata, _rows(40, start), table.io)
        RowDelta(tx).add(written).commit()
        files += written
    return files


def _partitions(files: list[Any]) -> set[tuple[Any, ...]]:
    return {tuple(f.partition) for f in files}


def test_a_snapshot_summary_derives_each_partition_path_once_per_table_and_counts_as_pyiceberg(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # pyiceberg's collector derived a partition's path (building the spec's partition type) for
    # every file added or removed; a partitioned flush adds a data and a delete file and removes
    # merged files in each partition it touches, and a world's next flush touches the same
    # partitions. Failed before: one derivation per file (12 here), then once per partition per
    # snapshot (the second snapshot derived its partitions' paths again).
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.table.snapshots import SnapshotSummaryCollector

    from sinks.rowdelta import write_partition_deletes
    from sinks.table_metadata import BuiltOnceTransaction

    table = _table(tmp_path)
    tx = BuiltOnceTransaction(table)  # the committer's: the table's schema and spec objects kept
    tx.set_properties({"write.summary.partition-limit": "100"})
    first = write_data_files(tx.table_metadata, _rows(60), table.io)
    # Counted from the snapshots on: the data files' locations derive paths too, once a process.
    paths = count_calls(monkeypatch, PartitionSpec, "partition_to_path")
    RowDelta(tx).add(first).commit()
    assert len(paths) == len(_partitions(first)) > 1
    second = write_data_files(tx.table_metadata, _rows(60, 60), table.io)
    scratch = StaticTable(table.name(), tx.table_metadata, table.metadata_location, table.io, None)  # type: ignore[arg-type]
    deletes = write_partition_deletes(scratch, None, {f.file_path: [0] for f in first[1:]})
    RowDelta(tx).add(second).add(deletes).remove(first[:1]).commit()
    snapshot = tx.table_metadata.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    touched = _partitions(second) | _partitions(deletes) | _partitions(first[:1])
    assert touched <= _partitions(first)
    assert len(paths) == len(_partitions(first))  # the second snapshot's partitions were all known

    theirs = SnapshotSummaryCollector(partition_summary_limit=100)
    metadata = tx.table_metadata
    for f in [*second, *deletes]:
        theirs.add_file(f, metadata.schema(), metadata.spec())
    theirs.remove_file(first[0], metadata.schema(), metadata.spec())
    expected = theirs.build()
    got = snapshot.summary.additional_properties
    assert {k: got[k] for k in expected} == expected


def test_the_key_lookup_decides_each_partition_once_not_each_file(tmp_path: Path, monkeypatch: Any) -> None:
    # A partition holds up to ~16 small files and their delete files; the scan's check resolved
    # the spec's fields for each of them. Failed before: one check per data file (3 flushes' files).
    from sinks.layout import KeyScan, key_filter
    from sinks.rowdelta import read_state

    table = _table(tmp_path)
    tx = table.transaction()
    files = _three_flushes(table, tx)
    after = StaticTable(table.name(), tx.table_metadata, table.metadata_location, table.io, None)  # type: ignore[arg-type]
    checks = count_calls(monkeypatch, KeyScan, "keeps")
    keys = {("person", "k00002"), ("place", "k00043")}
    state = read_state(
        after, ["object_type_id", "object_pk", "version"], None, None, key_filter("object_type_id", "object_pk", keys)
    )
    assert len(checks) == len(_partitions(files)) < len(files)
    assert state.index is not None
    assert {("person", "k00002"), ("place", "k00043")} <= set(
        zip(state.index.column("object_type_id").to_pylist(), state.index.column("object_pk").to_pylist(), strict=True)
    )


def test_the_key_lookup_masks_deleted_rows_of_every_file_with_a_fixed_number_of_compute_calls(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # A lookup reads every small file of the partitions it touches (up to ~16 each on the
    # partitioned layout), most with deletes; each added two compute calls. Failed before: one
    # pc.add per file with deletes (here 3 flushes x 8 partitions, plus the index's own).
    import pyarrow.compute as pc

    from sinks.layout import key_filter
    from sinks.rowdelta import read_state, write_partition_deletes

    table = _table(tmp_path)
    tx = table.transaction()
    files = _three_flushes(table, tx)
    scratch = StaticTable(table.name(), tx.table_metadata, table.metadata_location, table.io, None)  # type: ignore[arg-type]
    RowDelta(tx).add(write_partition_deletes(scratch, None, {f.file_path: [0] for f in files})).commit()
    RowDelta(tx).add(write_partition_deletes(scratch, None, {f.file_path: [0, 1] for f in files[:4]})).commit()
    after = StaticTable(table.name(), tx.table_metadata, table.metadata_location, table.io, None)  # type: ignore[arg-type]
    keys = {(("person", "place")[i % 2], f"k{i:05d}") for i in range(120)}
    adds = count_calls(monkeypatch, pc, "add")
    state = read_state(
        after, ["object_type_id", "object_pk"], None, None, key_filter("object_type_id", "object_pk", keys)
    )
    assert len(adds) <= 2
    assert state.index is not None
    first_rows = {(f.file_path, p) for f in files for p in (0,)} | {(f.file_path, 1) for f in files[:4]}
    got = set(zip(state.index.column("_file").to_pylist(), state.index.column("_pos").to_pylist(), strict=True))
    assert len(got) == 120 - len(first_rows)
    assert not got & first_rows
    assert {p: len(f.deleted) for p, f in state.files.items()} == {
        f.file_path: 2 if i < 4 else 1 for i, f in enumerate(files)
    }


def test_a_snapshot_names_its_manifests_and_list_with_one_location_provider_and_no_pyiceberg_output(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # pyiceberg built the table's location provider, and a PyArrowFile (a URI parse) only to take
    # its location, for every manifest; the list built another provider. Failed before: 2 location
    # providers and 1 output file for a snapshot of 1 manifest.
    import pyiceberg.table

    table, tx, first = _one_snapshot(tmp_path)
    second = write_data_files(tx.table_metadata, _rows(40, 40), table.io)
    providers = count_calls(monkeypatch, pyiceberg.table, "load_location_provider")  # Table.location_provider's
    outputs = count_calls(monkeypatch, PyArrowFileIO, "new_output")
    delta = RowDelta(tx).add(second).remove([first[0]])
    delta.commit()
    snapshot = tx.table_metadata.current_snapshot()
    assert snapshot is not None
    manifests = snapshot.manifests(table.io)  # pyiceberg reads the list and its manifests back
    written = [m.manifest_path for m in manifests if m.added_snapshot_id == snapshot.snapshot_id]
    assert len(written) == 1  # the removed file's manifest rewritten, with the added files
    assert (len(providers), len(outputs)) == (1, 0)
    assert sorted(delta._written_manifests) == sorted(written)  # noqa: SLF001 - pyiceberg's record of them
    for path in [*written, snapshot.manifest_list]:
        assert path.startswith(f"file://{tmp_path}/t/metadata/")
    assert all(f"{delta.commit_uuid}-m" in p for p in written)


def test_a_snapshots_totals_are_pyicebergs_without_reading_a_summary_model_as_a_mapping(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # pyiceberg's update_snapshot_summaries reads the new and the previous summary through
    # ``Summary.__getitem__`` (Mapping.get, a key's lower(), a pydantic private attribute),
    # ~150 µs of each of the 3 snapshots a commit writes. Failed before: 18 reads for a snapshot
    # with a parent. The totals are pyiceberg's rules on plain dicts.
    from pyiceberg.table.snapshots import Summary, update_snapshot_summaries

    table, tx, first = _one_snapshot(tmp_path, {"causeway.world": "w"})
    parent = tx.table_metadata.current_snapshot()
    second = write_data_files(tx.table_metadata, _rows(40, 40), table.io)
    reads = count_calls(monkeypatch, Summary, "__getitem__")
    RowDelta(tx).add(second).remove(first[:1]).commit()
    assert reads == []
    snapshot = tx.table_metadata.current_snapshot()
    assert parent is not None and parent.summary is not None
    assert snapshot is not None and snapshot.summary is not None
    assert parent.summary.additional_properties["causeway.world"] == "w"

    def pyicebergs(summary: Summary, previous: Summary | None) -> dict[str, str]:
        props = {k: v for k, v in summary.additional_properties.items() if not k.startswith("total-")}
        return update_snapshot_summaries(Summary(summary.operation, **props), previous).additional_properties

    assert parent.summary.additional_properties == pyicebergs(parent.summary, None)
    assert snapshot.summary.additional_properties == pyicebergs(snapshot.summary, parent.summary)
    assert snapshot.summary.operation == Operation.OVERWRITE
    assert snapshot.summary.additional_properties["total-data-files"] == str(len(first) + len(second) - 1)
    # A parent summary holding its operation alone is still a previous summary: no totals from zero.
    from sinks.rowdelta import _previous

    bare = parent.model_copy(update={"summary": Summary(Operation.APPEND)})
    assert _previous(bare) == {"operation": "append"}
    assert _previous(None) is None


def test_a_file_read_on_its_key_filters_false_positive_is_not_kept_as_used(tmp_path: Path, monkeypatch: Any) -> None:
    # A filter says "maybe" for a few keys in 10^4, so at a flush's hundreds of keys most files are
    # read now and then for keys they do not hold. Each such read counted as a use: in a soak of
    # fresh keys no file's key columns ever went idle, and the key index grew with the table.
    # Failed before: the files read on a false positive were as recently used as the one read for its key.
    import pyarrow.compute as pc

    from sinks.keyfilter import KeyFilter
    from sinks.layout import key_filter
    from sinks.rowdelta import FileCache, read_state

    table = _table(tmp_path)
    tx = table.transaction()
    files = _three_flushes(table, tx)
    after = StaticTable(table.name(), tx.table_metadata, table.metadata_location, table.io, None)  # type: ignore[arg-type]
    now = [0.0]
    cache = FileCache(64 << 20, idle_s=120.0, clock=lambda: now[0])
    cache.min_filter_rows = 1  # every file gets a filter on its first read
    cols = ["object_type_id", "object_pk", "version"]
    every = {(("person", "place")[i % 2], f"k{i:05d}") for i in range(120)}
    # Every file read, its filter built, all used at 0.
    read_state(after, cols, None, cache, key_filter("object_type_id", "object_pk", every))
    monkeypatch.setattr(KeyFilter, "may_hold", lambda self, probe: True)  # every filter says "maybe"
    wanted = pa.array(["k00002"])

    def look_up_k00002() -> Any:
        return read_state(
            after,
            cols,
            lambda t: pc.is_in(t.column("object_pk"), value_set=wanted),
            cache,
            key_filter("object_type_id", "object_pk", {("person", "k00002")}),
        )

    now[0] = 100.0
    state = look_up_k00002()
    assert state.index is not None and state.index.column("object_pk").to_pylist() == ["k00002"]
    holder = state.index.column("_file")[0].as_py()
    assert state.files_read > 1  # the other files of its partition were read on the "maybe"
    now[0] = 200.0  # 200 s after the first lookup, 100 s after the second
    assert cache.get(None, holder, tuple(cols))[1]  # type: ignore[arg-type] - held (it had the key); the rest went idle
    held = {path for path, _ in cache._items}  # noqa: SLF001
    assert held == {holder}, sorted(held)
    assert len({f.file_path for f in files}) > 1
    # Read again from storage on a "maybe", a file that holds none of the keys is not kept either.
    now[0] = 210.0
    again = look_up_k00002()
    assert again.files_read == state.files_read and again.bytes_read > 0
    assert {path for path, _ in cache._items} == {holder}  # noqa: SLF001
