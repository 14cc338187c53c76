# mypy: disable-error-code="call-arg"
"""Table metadata built without pyiceberg's deep copy equals pyiceberg's, and each file is parsed once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    RemoveSnapshotsUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
    update_table_metadata,
)
from pyiceberg.types import LongType, NestedField, StringType

from sinks.table_metadata import MetadataCache, build, metadata_json
from tests.calls import count_calls


def _base() -> TableMetadata:
    schema = Schema(
        NestedField(1, "pk", StringType(), required=False), NestedField(2, "version", LongType(), required=False)
    )
    return new_table_metadata(
        schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///tmp/t", {"format-version": "2"}
    )


def _snapshot(snapshot_id: int, parent: int | None, seq: int) -> tuple[TableUpdate, ...]:
    snap = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent,
        sequence_number=seq,
        timestamp_ms=1_700_000_000_000 + seq,
        manifest_list=f"file:///tmp/t/metadata/snap-{snapshot_id}.avro",
        summary=Summary(Operation.APPEND, **{"added-records": "1"}),
        schema_id=0,
    )
    ref = SetSnapshotRefUpdate(
        snapshot_id=snapshot_id, parent_snapshot_id=parent, ref_name="main", type=SnapshotRefType.BRANCH
    )
    return (AddSnapshotUpdate(snapshot=snap), ref)


def _a_flush(base: TableMetadata) -> tuple[TableUpdate, ...]:
    """What a committer's transaction stages: properties, a snapshot, and an expiry."""
    updates: tuple[TableUpdate, ...] = (SetPropertiesUpdate(updates={"causeway.committed-offsets": '{"t/0":{}}'}),)
    updates += _snapshot(11, None, 1) + _snapshot(12, 11, 2) + _snapshot(13, 12, 3)
    return updates + (RemoveSnapshotsUpdate(snapshot_ids=[11, 12]),)


def test_build_gives_pyicebergs_metadata() -> None:
    base = _base()
    for location in (None, "file:///tmp/t/metadata/00001-x.metadata.json"):
        ours = build(base, _a_flush(base), location)
        theirs = update_table_metadata(base, _a_flush(base), metadata_location=location)
        assert ours.model_dump() == theirs.model_dump()
        assert [s.snapshot_id for s in ours.snapshots] == [13] and ours.current_snapshot_id == 13
    assert build(base, ()) is base  # no change, nothing built


def test_build_does_not_copy_what_the_updates_leave_alone() -> None:
    """pyiceberg deep-copies the whole metadata after applying the updates (schemas, specs, retained
    snapshots, the metadata log, the offset map) on every build: most of a commit's metadata CPU.
    This fails if the copy comes back."""
    base = _base()
    built = build(base, _a_flush(base))
    assert built.schemas is base.schemas and built.partition_specs is base.partition_specs
    later = build(built, (SetPropertiesUpdate(updates={"k": "v"}),))
    assert later.snapshots is built.snapshots and later.snapshots[0] is built.snapshots[0]


def test_a_tables_metadata_file_is_parsed_once_and_what_was_written_is_never_parsed(tmp_path: Path) -> None:
    io = PyArrowFileIO()
    base = _base()
    cache = MetadataCache(max_tables=2)
    paths = [f"file://{tmp_path}/{n}.metadata.json" for n in range(4)]
    for p in paths:
        ToOutputFile.table_metadata(base, io.new_output(p))
    events, common, edge = (("world-a", ("onto", t)) for t in ("entity_events", "entity_common", "entity_edge"))

    first = cache.read(events, io, paths[0])
    assert cache.read(events, io, paths[0]) is first and cache.parses == 1
    assert first.model_dump() == base.model_dump()
    cache.put(events, paths[1], base)  # a commit wrote the next version: the one read next
    assert cache.read(events, io, paths[1]) is base and cache.parses == 1
    cache.read(events, io, paths[0])  # an older version (a pinned read): parsed, and kept instead
    assert cache.parses == 2
    cache.read(common, io, paths[2])
    cache.read(edge, io, paths[3])  # past the bound: the least recently used table (events) goes
    assert cache.parses == 4
    cache.read(events, io, paths[0])
    assert cache.parses == 5
    with pytest.raises(FileNotFoundError):
        cache.read(events, io, f"file://{tmp_path}/missing.metadata.json")


def test_metadata_json_serialises_each_kept_snapshot_and_schema_once_and_is_pyicebergs_json(
    monkeypatch: Any,
) -> None:
    # A commit's metadata JSON re-serialised every retained snapshot (~16 a table) and the schema
    # that the previous version held, as the same objects (failed before: no such function; the
    # catalog dumped the whole metadata, ~374 µs a table against ~250 with the kept parts).
    base = _base()
    # Text that looks like the spliced fields, in a property value and as a ref name.
    base = build(base, (SetPropertiesUpdate(updates={"x": '{"snapshots":[],"schemas":[]}'}),))
    first = build(base, _snapshot(11, None, 1) + _snapshot(12, 11, 2))
    first = build(first, (SetSnapshotRefUpdate(snapshot_id=11, ref_name="schemas", type=SnapshotRefType.TAG),))
    dumps = count_calls(monkeypatch, Snapshot, "model_dump_json")
    schema_dumps = count_calls(monkeypatch, Schema, "model_dump_json")
    for exclude_none in (True, False):
        assert metadata_json(first, exclude_none) == first.model_dump_json(exclude_none=exclude_none)
    assert len(dumps) == 4 and len(schema_dumps) == 2  # each once per setting
    second = build(first, _snapshot(13, 12, 3))
    assert metadata_json(second, True) == second.model_dump_json(exclude_none=True)
    assert len(dumps) == 5 and len(schema_dumps) == 2  # the new snapshot only
    empty = _base()
    assert metadata_json(empty, True) == empty.model_dump_json(exclude_none=True)


def test_the_kept_json_of_a_snapshot_goes_with_the_snapshot() -> None:
    # The cache held each snapshot it serialised, up to 8,192 before a clear: a 3-world soak kept
    # ~4,000 expired snapshots and their summaries alive (failed before: the entry, and the object
    # through it, stayed).
    import gc
    import weakref

    from sinks import table_metadata

    table_metadata._FRAGMENTS.clear()
    first = build(_base(), _snapshot(11, None, 1) + _snapshot(12, 11, 2))
    assert metadata_json(first, True) == first.model_dump_json(exclude_none=True)
    alive = weakref.ref(first.snapshots[0])
    kept = len(table_metadata._FRAGMENTS)
    assert kept >= 3  # two snapshots and the schema
    # Expire snapshot 11: once no metadata holds it, neither does the cache.
    second = build(first, (RemoveSnapshotsUpdate(snapshot_ids=[11]),))
    assert metadata_json(second, True) == second.model_dump_json(exclude_none=True)
    del first
    gc.collect()
    assert alive() is None
    assert len(table_metadata._FRAGMENTS) == kept - 1
    # what is still in use is served from the cache, as before
    assert metadata_json(second, True) == second.model_dump_json(exclude_none=True)
