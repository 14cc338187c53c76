"""FileCache (sinks/rowdelta.py): its byte bound must bound the memory its entries keep alive."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sinks.rowdelta import FileCache, _cost


def _kept_bytes(cache: FileCache) -> int:
    """Bytes of every distinct Arrow buffer the cache's entries reference (what stays allocated)."""
    seen: dict[int, int] = {}
    for table in cache._items.values():  # noqa: SLF001 - the test measures what the cache holds
        for column in table.columns:
            for chunk in column.chunks:
                for buf in chunk.buffers():
                    if buf is not None:
                        seen[buf.address] = buf.size
    return sum(seen.values())


def test_seeded_slices_of_one_batch_keep_no_more_than_the_bound() -> None:
    # A flush writes one file per partition; each file's rows are a slice of the whole batch (what
    # write_data_files_with_rows returns), and a slice's ``nbytes`` counts only its own rows while it
    # keeps the batch's buffers alive. Seeded as they were, 12 slices kept the whole batch for the
    # price of one or two (failed before: 3.84 MB kept under a 0.64 MB bound, 6x).
    rows = 120_000
    batch = pa.table({"entity_pk": [f"c17-key-{i:012d}" for i in range(rows)], "version": list(range(rows))})
    per_file = rows // 12
    bound = 2 * (batch.slice(0, per_file).nbytes + FileCache.ENTRY_BYTES) + 1024
    cache = FileCache(max_bytes=bound)
    for i in range(12):
        cache.seed(f"s3://w/data/f{i}.parquet", ("entity_pk", "version"), batch.slice(i * per_file, per_file))
    del batch
    assert len(cache._items) == 2  # noqa: SLF001 - the newest two files fit
    assert _kept_bytes(cache) <= bound


def test_a_seeded_table_reads_back_equal() -> None:
    batch = pa.table({"entity_pk": ["a", "b", "c", "d"], "version": [1, 2, 3, 4]})
    cache = FileCache(max_bytes=1 << 20)
    cache.seed("f.parquet", ("entity_pk", "version"), batch.slice(1, 2))
    got, hit = cache.get(None, "f.parquet", ("entity_pk", "version"))  # type: ignore[arg-type]
    assert hit
    assert got.equals(batch.slice(1, 2))


def test_kept_rows_stay_within_a_quarter_of_the_bound_and_go_when_forgotten() -> None:
    # Full rows of small files, kept for the small-file merge, must not grow the cache past its
    # bound nor evict the key index they sit beside.
    batch = pa.table({"entity_pk": [f"k{i:08d}" for i in range(4000)], "version": list(range(4000))})
    part = batch.slice(0, 1000)
    cache = FileCache(max_bytes=8 * part.nbytes)
    cache.seed("idx.parquet", ("entity_pk",), batch.select(["entity_pk"]).slice(0, 1000))
    for i in range(4):
        cache.seed_rows(f"f{i}.parquet", batch.slice(i * 1000, 1000))
    assert cache._rows_bytes <= cache.max_bytes // 4  # noqa: SLF001 - the bound measured
    assert cache.rows("f0.parquet") is None and cache.rows("f3.parquet") is not None  # oldest went first
    assert cache.get(None, "idx.parquet", ("entity_pk",))[1]  # type: ignore[arg-type] - the index stays
    cache.forget(["f3.parquet", "never-kept.parquet"])
    assert cache.rows("f3.parquet") is None
    assert cache._rows_bytes == sum(map(_cost, cache._rows.values()))  # noqa: SLF001


def test_key_filters_stay_within_half_of_the_bound_and_go_oldest_first() -> None:
    # Each filter is counted (a few bytes a key): the worker's memory stays bounded as files add
    # up, and without a spill an evicted file's filter is simply absent (the next lookup then
    # reads that file).
    keys = pa.array([f"k{i:06d}" for i in range(3000)])
    one = 16 * 1024 + FileCache.ENTRY_BYTES  # a 3,000-key filter: 2,048 words
    cache = FileCache(max_bytes=2 * 4 * one)  # half: 4 filters
    for i in range(6):
        cache.seed_filter(f"f{i}.parquet", "entity_pk", keys)
    assert cache._filters_bytes == sum(map(_cost, cache._filters.values()))  # noqa: SLF001
    assert cache._filters_bytes <= cache.max_bytes // 2  # noqa: SLF001 - the bound measured
    assert len(cache._filters) == 4  # noqa: SLF001
    assert cache.key_filter("f0.parquet", "entity_pk") is None
    assert cache.key_filter("f5.parquet", "entity_pk") is not None
    assert FileCache(0).key_filter("f5.parquet", "entity_pk") is None  # no bound, no filters
    cache.seed_filter("small.parquet", "entity_pk", keys.slice(0, cache.min_filter_rows - 1))
    assert cache.key_filter("small.parquet", "entity_pk") is None  # read whole: cheaper than a filter


def test_key_filters_and_key_columns_share_the_bound_and_filters_come_first() -> None:
    # The filters took a fixed eighth apart from the key columns (32 MiB of 256): a table whose
    # keys keep growing outgrew it while the key columns' room sat unused. Now they share the one
    # bound: a filter evicts key columns past it, key columns never evict a filter.
    keys = pa.array([f"k{i:06d}" for i in range(3000)])
    index = pa.table({"entity_pk": keys, "version": list(range(3000))})
    cache = FileCache(max_bytes=4 * (index.nbytes + FileCache.ENTRY_BYTES))
    for i in range(4):
        cache.seed(f"i{i}.parquet", ("entity_pk", "version"), index)
    assert len(cache._items) == 4  # noqa: SLF001 - the key columns fill the bound
    for i in range(3):
        cache.seed_filter(f"f{i}.parquet", "entity_pk", keys)
    assert len(cache._filters) == 3  # noqa: SLF001
    assert cache._bytes + cache._filters_bytes <= cache.max_bytes  # noqa: SLF001 - one bound for both
    assert ("i0.parquet", ("entity_pk", "version")) not in cache._items  # noqa: SLF001 - the oldest columns went
    for i in range(4, 12):
        cache.seed(f"i{i}.parquet", ("entity_pk", "version"), index)
    assert [k[0] for k in cache._filters] == ["f0.parquet", "f1.parquet", "f2.parquet"]  # noqa: SLF001
    assert cache._bytes + cache._filters_bytes <= cache.max_bytes  # noqa: SLF001


def test_an_evicted_filter_comes_back_from_the_spill_equal_and_is_not_built_again(
    tmp_path: Any, monkeypatch: Any
) -> None:
    # An evicted filter was rebuilt from its file's key column on the next lookup, and once the
    # filters a lookup probes outgrew the budget every lookup rebuilt them all (62 % of a soak's
    # worker). Now it is written to the spill once, on eviction, and read back from there.
    from sinks.filter_spill import FilterSpill
    from sinks.keyfilter import KeyFilter, Probe
    from tests.calls import count_calls

    keys = pa.array([f"k{i:06d}" for i in range(3000)])
    spill = FilterSpill(tmp_path, 1 << 20)
    cache = FileCache(max_bytes=2 * 2 * (16 * 1024 + FileCache.ENTRY_BYTES), spill=spill)  # 2 filters in memory
    for i in range(6):
        cache.seed_filter(f"f{i}.parquet", "entity_pk", pa.array([f"f{i}-{k}" for k in keys.to_pylist()]))
    assert spill.writes == 4 and len(cache._filters) == 2  # noqa: SLF001 - the four oldest went to disk
    builds = count_calls(monkeypatch, KeyFilter, "build")
    probe = Probe.of(pa.array(["f3-k000007", "f0-k002999", "absent"]))
    for _ in range(3):  # three lookups over six filters that only two fit in memory
        held = [cache.key_filter(f"f{i}.parquet", "entity_pk") for i in range(6)]
        assert all(h is not None for h in held)
        assert [h.may_hold(probe) for h in held if h is not None][:4] == [True, False, False, True]
    assert not builds
    assert spill.writes == 6  # each filter written once: one read back and evicted again is not
    assert cache._filters_bytes <= cache.max_bytes // 2  # noqa: SLF001
    assert spill.bytes == sum(spill._files.values()) <= spill.max_bytes  # noqa: SLF001
    [folder] = list(tmp_path.iterdir())
    cache.forget(["f0.parquet", "f1.parquet", "f2.parquet", "f3.parquet", "f4.parquet", "f5.parquet"])
    assert not list(folder.iterdir())  # the removed files' filters leave the disk too
    assert cache.key_filter("f0.parquet", "entity_pk") is None


def test_the_spill_is_bounded_and_its_directory_goes_with_it(tmp_path: Any) -> None:
    import gc
    import os

    from sinks.filter_spill import FilterSpill
    from sinks.keyfilter import KeyFilter

    kf = KeyFilter.build(pa.array([f"k{i:06d}" for i in range(3000)]))
    (tmp_path / "999999999-dead").mkdir()  # a store of a process that no longer runs
    (tmp_path / f"{os.getpid()}-mine").mkdir()  # this process's: kept
    spill = FilterSpill(tmp_path, 3 * kf.nbytes)
    for i in range(5):
        spill.put((f"f{i}.parquet", "event_id"), kf)
    assert spill.bytes == 3 * kf.nbytes
    assert spill.get(("f0.parquet", "event_id")) is None  # least recently used: removed
    got = spill.get(("f4.parquet", "event_id"))
    assert got is not None and got.words.equals(kf.words)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(str(os.getpid()))) == []
    folders = [p for p in tmp_path.iterdir() if p.name != f"{os.getpid()}-mine"]
    assert len(folders) == 1 and len(list(folders[0].iterdir())) == 3
    del spill
    gc.collect()
    assert not folders[0].exists()


def test_a_key_filter_reads_back_from_its_bytes_and_refuses_a_torn_one() -> None:
    from sinks.keyfilter import KeyFilter, Probe

    kf = KeyFilter.build(pa.array([f"k{i:06d}" for i in range(3000)]))
    back = KeyFilter.from_bytes(kf.to_bytes())
    assert back is not None and back.words.equals(kf.words)
    assert back.may_hold(Probe.of(pa.array(["k000042"])))
    assert KeyFilter.from_bytes(kf.to_bytes()[:-8]) is None  # not a power of two of words
    assert KeyFilter.from_bytes(b"") is None


def test_rows_of_concatenated_files_know_their_file_and_position() -> None:
    from sinks.rowdelta import _with_file_positions

    files = [pa.table({"k": ["a", "b", "c"]}), pa.table({"k": ["d"]}), pa.table({"k": ["e", "f"]})]
    whole = _with_file_positions(pa.concat_tables(files), [3, 1, 2])
    assert whole.column("k").to_pylist() == ["a", "b", "c", "d", "e", "f"]
    assert whole.column("_fid").to_pylist() == [0, 0, 0, 1, 2, 2]
    assert whole.column("_pos").to_pylist() == [0, 1, 2, 0, 0, 1]
    assert whole.schema.field("_pos").type == whole.schema.field("_fid").type == pa.int64()


def test_a_small_files_rows_are_copied_once_for_the_rows_and_the_key_index() -> None:
    # A flush keeps a small file's rows (for the small-file merge) and its key columns (for the
    # next lookup); each was a copy of the slice of the flush's batch. Failed before: seed_rows
    # returned nothing, and the key columns were a second copy.
    batch = pa.table({"entity_pk": [f"k{i:08d}" for i in range(4000)], "version": list(range(4000))})
    cache = FileCache(max_bytes=64 * batch.nbytes)
    kept = cache.seed_rows("f.parquet", batch.slice(1000, 1000))
    assert kept.equals(batch.slice(1000, 1000))
    cache.seed("f.parquet", ("entity_pk",), kept.select(["entity_pk"]))
    rows = cache.rows("f.parquet")
    index, hit = cache.get(None, "f.parquet", ("entity_pk",))  # type: ignore[arg-type]
    assert hit and rows is not None
    shared = {b.address for b in rows.column("entity_pk").chunk(0).buffers() if b is not None}
    assert {b.address for b in index.column("entity_pk").chunk(0).buffers() if b is not None} == shared
    assert rows.get_total_buffer_size() <= batch.slice(1000, 1000).nbytes + 4096  # its own buffers, not the batch's


def test_a_delete_file_holds_each_files_positions_sorted_once_and_is_bounded_by_the_files_it_names(
    tmp_path: Any, monkeypatch: Any
) -> None:
    # A flush's positions are Python ints; they were made unique and sorted by three compute calls
    # per data file named (a partitioned flush writes a delete file per partition). The file-path
    # bounds named every path given, even one without positions. Failed before: pc.unique called
    # per path, and the upper bound was "z.parquet".
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from sinks.rowdelta import FILE_PATH_ID, write_position_deletes
    from tests.calls import count_calls

    uniques = count_calls(monkeypatch, pc, "unique")
    cache = FileCache()
    df = write_position_deletes(
        PyArrowFileIO(),
        f"file://{tmp_path}/d.parquet",
        {"b.parquet": [5, 1, 5, 3], "a.parquet": {9, 0}, "z.parquet": [], "c.parquet": pa.array([7, 2, 7], pa.int32())},
        cache=cache,
    )
    assert df is not None
    assert len(uniques) == 1  # the Arrow input only
    t = pq.read_table(f"{tmp_path}/d.parquet")
    assert t.column("file_path").to_pylist() == ["a.parquet"] * 2 + ["b.parquet"] * 3 + ["c.parquet"] * 2
    assert t.column("pos").to_pylist() == [0, 9, 1, 3, 5, 2, 7]
    assert t.schema.field("pos").type == pa.int64()
    assert (df.lower_bounds[FILE_PATH_ID], df.upper_bounds[FILE_PATH_ID]) == (b"a.parquet", b"c.parquet")
    assert df.record_count == 7
    split = cache._split[f"file://{tmp_path}/d.parquet"]  # noqa: SLF001 - what the next lookup takes
    assert {p: v.to_pylist() for p, v in split.items()} == {
        "a.parquet": [0, 9],
        "b.parquet": [1, 3, 5],
        "c.parquet": [2, 7],
    }


def test_files_a_commit_removed_leave_every_part_of_the_cache() -> None:
    # A merged data file or dropped delete file is never read again (reads are planned from the
    # live snapshot), so nothing kept for it may stay until LRU eviction: in a soak the key index
    # held ~32k files after 20 minutes, most of them merged away (failed before: only the full
    # rows went, the index entry, key filter and delete split stayed).
    keys = pa.array([f"k{i:06d}" for i in range(3000)])
    index = pa.table({"entity_pk": keys, "version": list(range(3000))})
    cache = FileCache(max_bytes=64 << 20)
    for name in ("gone.parquet", "kept.parquet"):
        cache.seed(name, ("entity_pk", "version"), index)
        cache.seed_filter(name, "entity_pk", keys)
        cache.seed_rows(name, index)
    cache.seed_split("gone-deletes.parquet", {"gone.parquet": pa.array([1, 2], pa.int64())})
    held = cache._bytes  # noqa: SLF001 - the count the bound checks
    cache.forget(["gone.parquet", "gone-deletes.parquet", "never-kept.parquet"])
    assert cache.get(None, "kept.parquet", ("entity_pk", "version"))[1]  # type: ignore[arg-type] - still held
    assert [k[0] for k in cache._items] == ["kept.parquet"]  # noqa: SLF001
    assert cache._bytes < held  # noqa: SLF001
    assert cache.key_filter("gone.parquet", "entity_pk") is None
    assert cache.key_filter("kept.parquet", "entity_pk") is not None
    assert cache.rows("gone.parquet") is None and cache.rows("kept.parquet") is not None
    assert "gone-deletes.parquet" not in cache._split  # noqa: SLF001
    assert cache._filters_bytes == sum(map(_cost, cache._filters.values()))  # noqa: SLF001


def test_the_bound_counts_what_an_entry_costs_beyond_its_buffers() -> None:
    # A cached table costs ~3-4 KB of C++ objects (schema, arrays, buffer headers) outside
    # ``nbytes``; the soak's index entries average ~5 KB of buffers, so counting buffers only let
    # the cache hold about twice its bound (failed before: 1,000 tiny entries under a bound that
    # should hold ~100 of them).
    tiny = pa.table({"entity_pk": ["a", "b"], "version": [1, 2]})
    cache = FileCache(max_bytes=100 * (tiny.nbytes + FileCache.ENTRY_BYTES))
    for i in range(1000):
        cache.seed(f"f{i}.parquet", ("entity_pk", "version"), tiny)
    assert len(cache._items) == 100  # noqa: SLF001
    assert cache._bytes <= cache.max_bytes  # noqa: SLF001


def test_key_columns_and_kept_rows_no_flush_used_for_idle_s_go_before_the_bound() -> None:
    """A table that keeps growing seeds an entry for every file it writes; most are never read
    again. Before: they stayed until the bound (in a 30-minute soak the key index grew by ~6.5 MiB a
    minute and would have reached its 256 MiB bound only after ~40 minutes)."""
    now = [0.0]
    cache = FileCache(max_bytes=64 << 20, idle_s=120.0, clock=lambda: now[0])
    index = pa.table({"entity_pk": [f"k{i:05d}" for i in range(1000)], "version": list(range(1000))})
    cols = ("entity_pk", "version")
    cache.seed("old.parquet", cols, index)
    cache.seed_rows("old-rows.parquet", index)
    now[0] = 60.0
    cache.seed("used.parquet", cols, index)
    now[0] = 100.0
    assert cache.get(None, "old.parquet", cols)[1]  # type: ignore[arg-type] - read: used again at 100
    now[0] = 200.0
    cache.seed("new.parquet", cols, index)  # used.parquet (60) and the kept rows (0) are idle past 120 s
    assert [k[0] for k in cache._items] == ["old.parquet", "new.parquet"]  # noqa: SLF001
    assert cache.rows("old-rows.parquet") is None
    assert cache._bytes == sum(map(_cost, cache._items.values()))  # noqa: SLF001 - counted as they go
    assert cache._rows_bytes == 0  # noqa: SLF001
    assert set(cache._used) == set(cache._items)  # noqa: SLF001 - nothing left behind
    never = FileCache(max_bytes=64 << 20, clock=lambda: now[0])  # idle_s 0: only the bound evicts
    never.seed("a.parquet", cols, index)
    now[0] = 10_000.0
    assert never.get(None, "a.parquet", cols)[1]  # type: ignore[arg-type]
