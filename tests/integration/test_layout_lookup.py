"""A flush's key lookup follows the batch, not the table (issues 13 and 21): per-file key filters.

Fresh keys touch every (type, bucket) partition; the lookup must still read only the data files
that may hold one of the batch's keys, and never miss a row of a key that exists (a missed row is a
second live row: ``objects`` fails on a duplicate).
"""

from __future__ import annotations

import random

import pytest

from sinks.committer import BatchCommitter
from sinks.tables import COMMON
from tests.integration.commits import batch, obj, objects
from tests.integration.layout_helpers import ReadRecorder, cat_of

pytestmark = pytest.mark.integration


def _live_data_files(committer: BatchCommitter, world: str) -> set[str]:
    table = cat_of(committer, world).load_table(("onto", COMMON.name))
    return {t.file.file_path for t in table.scan().plan_files()}


def _committer(sink_settings, client) -> BatchCommitter:  # type: ignore[no-untyped-def]
    # Four key buckets (the default is type only): these tests need a type's keys spread over
    # many files, which a flush per bucket makes quickly.
    committer = BatchCommitter(sink_settings.replace(projection_buckets=4), client)
    committer.file_cache.min_filter_rows = 1  # small test files stand in for large ones
    return committer


def test_a_batch_of_fresh_keys_reads_only_the_files_that_may_hold_its_keys(client, sink_settings, world) -> None:
    committer = _committer(sink_settings, client)
    created: list[str] = []
    for i in range(10):  # ten flushes of fresh keys: a file per bucket each (under compaction's count)
        pks = [f"k{i:02d}-{j:03d}" for j in range(80)]
        committer.commit_batch(batch(world, f"grow-{i}", [obj(world, pk, "CREATE", 1, n=0) for pk in pks], i * 100))
        created += pks
    files = _live_data_files(committer, world)
    assert len(files) >= 30

    reads = ReadRecorder(committer)
    updated = created[:3]  # all three from the first flush's files
    events = [obj(world, f"new-{j:03d}", "CREATE", 1, n=0) for j in range(80)]
    events += [obj(world, pk, "UPDATE", 2, n=1) for pk in updated]
    committer.commit_batch(batch(world, "fresh", events, 5000))

    data_reads = {p for p in reads.paths if p in files}
    # Before the key filters: every file of every touched partition (all of them) was read.
    assert len(data_reads) <= len(files) // 5, f"read {len(data_reads)} of {len(files)} data files"
    rows = objects(cat_of(committer, world))
    assert len(rows) == len(created) + 80
    assert all(rows[pk][0] == (2 if pk in updated else 1) for pk in created)


def test_updates_and_deletes_of_keys_across_many_files_find_their_rows(client, sink_settings, world) -> None:
    # Random changes of keys spread over many files, by the committer that wrote them (filters kept
    # at write) and by a fresh one (a restarted worker: no filter until a file is first read).
    rng = random.Random(20261201)
    warm = _committer(sink_settings, client)
    cold = _committer(sink_settings, client)
    model: dict[str, tuple[int, bool]] = {}
    offset, fresh = 0, 0
    for i in range(14):
        committer = cold if i in (8, 11) else warm
        events = []
        for _ in range(60):  # fresh keys
            pk = f"r{fresh:05d}"
            fresh += 1
            events.append(obj(world, pk, "CREATE", 1, n=0))
            model[pk] = (1, False)
        for pk in rng.sample(sorted(model), min(len(model) - 60, 25)) if i else []:
            version, deleted = model[pk]
            if deleted or pk.startswith("r") and int(pk[1:]) >= fresh - 60:
                continue  # created in this batch, or gone
            if rng.random() < 0.2:
                events.append(obj(world, pk, "DELETE", version + 1))
                model[pk] = (version + 1, True)
            else:
                events.append(obj(world, pk, "UPDATE", version + 1, n=version))
                model[pk] = (version + 1, False)
        committer.commit_batch(batch(world, f"mix-{i}", events, offset))
        offset += len(events)
    assert len(_live_data_files(warm, world)) >= 20
    rows = objects(cat_of(warm, world))  # fails on a duplicate live row
    assert {pk: (v, d) for pk, (v, d, _) in rows.items()} == model
