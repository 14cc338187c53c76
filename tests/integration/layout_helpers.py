"""Worlds for the table-layout tests: tables as causeway created them before layouts, and the checks
that an evolved world still writes, reads and rebuilds correctly (used by the CLI and the control-event tests)."""

from __future__ import annotations

from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

from models.events import ChangeEvent
from ops.rebuild.run import rebuild
from sinks.catalog import NessieCatalog
from sinks.committer import BatchCommitter
from sinks.tables import ALL_TABLES, COMMON, EVENTS, table_properties
from tests.integration.commits import batch, obj, objects


def cat_of(committer: BatchCommitter, world: str) -> NessieCatalog:
    return committer.catalog(f"world-{world}")


def legacy_tables(committer: BatchCommitter, world: str) -> None:
    """Create the three tables as causeway created them before layouts (no spec, no sort, no batch_seq)."""
    cat = cat_of(committer, world)
    cat.begin()
    for tdef in ALL_TABLES:
        schema = tdef.schema
        if tdef is EVENTS:
            schema = Schema(*[f for f in schema.fields if f.name != "batch_seq"])
        props = {k: v for k, v in table_properties(1 << 26).items() if k != "gc.enabled"}
        cat.create_table(
            ("onto", tdef.name),
            schema,
            partition_spec=PartitionSpec(),
            sort_order=UNSORTED_SORT_ORDER,
            properties=props,
        )
    cat.publish("legacy tables")


def legacy_world_with_data(committer: BatchCommitter, world: str) -> tuple[list[ChangeEvent], dict]:  # type: ignore[type-arg]
    """Tables as before layouts, holding two types' objects; the events and the projection."""
    legacy_tables(committer, world)
    first = [obj(world, f"p{i}", "CREATE", 1, n=i) for i in range(60)]
    first += [obj(world, f"p{i}", "UPDATE", 2, n=i * 10) for i in range(0, 60, 3)]
    first += [obj(world, f"q{i}", "CREATE", 1, typ="place", n=i) for i in range(20)]
    committer.commit_batch(batch(world, "before", first, 0))
    return first, objects(cat_of(committer, world))


def writes_reads_and_rebuild_after_evolution(settings, committer, world, first, before) -> None:  # type: ignore[no-untyped-def]
    """After an evolution of a world holding ``first`` (projection ``before``): writes across old-
    and new-spec files give the model's projection, the log keeps every row, both specs are in use,
    and a rebuild from the log equals the live projection."""
    # Writes after the change: updates of rows in old-spec files, deletes, a truncate, new keys.
    # (few enough that the old-spec file stays under compaction's half-deleted threshold)
    # One type per flush, so that each writes under the new spec: a small flush of several types
    # under a spec without a bucket writes one unpartitioned file (``sinks.layout.writes_one_file``).
    people = [obj(world, f"p{i}", "UPDATE", 3, n=i * 100) for i in range(0, 60, 6)]
    people += [obj(world, f"p{i}", "DELETE", 4) for i in range(0, 10)]
    people += [obj(world, f"r{i}", "CREATE", 1, n=i) for i in range(30)]
    places = [obj(world, "*", "TRUNCATE", 1, typ="place"), obj(world, "q1", "CREATE", 1, typ="place", n=7)]
    committer.commit_batch(batch(world, "after", people, 1000))
    committer.commit_batch(batch(world, "after-places", places, 1000 + len(people)))
    after = people + places
    cat = cat_of(committer, world)
    rows = objects(cat)
    model = dict(before)
    for i in range(0, 60, 6):
        model[f"p{i}"] = (3, False, None)
    for i in range(10):
        model[f"p{i}"] = (4, True, None)
    for i in range(20):
        model.pop(f"q{i}")
    model["q1"] = (1, False, None)
    for i in range(30):
        model[f"r{i}"] = (1, False, None)
    assert {k: v[:2] for k, v in rows.items()} == {k: v[:2] for k, v in model.items()}
    events = cat.load_table(("onto", EVENTS.name))
    assert events.scan().to_arrow().num_rows == len(first) + len(after)
    specs_in_use = {t.file.spec_id for t in cat.load_table(("onto", COMMON.name)).scan().plan_files()}
    assert len(specs_in_use) == 2, "old files keep their spec, new ones use the new spec"

    result = rebuild(settings, world, write=False)
    assert result.identical, [d.sample() for d in result.diffs]


class ReadRecorder:
    """Wraps the committer's file cache to record every data/delete file a flush reads."""

    def __init__(self, committer: BatchCommitter) -> None:
        self.paths: list[str] = []
        inner = committer.file_cache.get

        def get(io, path, columns, **kw):  # type: ignore[no-untyped-def]
            self.paths.append(path)
            return inner(io, path, columns, **kw)

        committer.file_cache.get = get  # type: ignore[method-assign]
