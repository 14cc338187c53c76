"""The soak's memory probe: it finds the worker's holders without keeping them alive, and counts the
buffers a cached table really keeps (a slice keeps its parent's)."""

import gc
import json

import pyarrow as pa

from bench import memory_probe
from sinks.rowdelta import FileCache


def test_a_slice_counts_the_whole_buffer_it_keeps_alive() -> None:
    whole = pa.table({"k": pa.array(range(100_000), pa.int64())})
    part = whole.slice(0, 10)
    assert part.nbytes == 80
    assert memory_probe._buffers_bytes([part]) >= 800_000
    # two slices of one table share its buffer: counted once
    assert memory_probe._buffers_bytes([part, whole.slice(10, 10)]) == memory_probe._buffers_bytes([part])


def test_the_probe_reports_a_file_cache_built_after_it_is_installed_and_forgets_it_once_dropped() -> None:
    memory_probe._register(FileCache, "file_cache")
    cache = FileCache(1_000_000)
    cache.seed_rows("f1", pa.table({"k": pa.array(range(1_000), pa.int64())}))
    reported = [c for c in memory_probe.sample()["file_caches"] if c["max_bytes"] == 1_000_000]
    assert reported and reported[0]["rows_files"] == 1 and reported[0]["rows_buffers"] >= 8_000
    del cache, reported
    gc.collect()
    assert not [c for c in memory_probe.sample()["file_caches"] if c["max_bytes"] == 1_000_000]


def test_the_report_reads_the_samples_back_in_mib(tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = memory_probe.sample()
    doc["elapsed_s"] = 60.0
    path = tmp_path / "mem.jsonl"
    path.write_text(json.dumps(doc) + "\n")
    (row,) = memory_probe.rows([json.loads(path.read_text())])
    assert row["min"] == 1.0 and 0 < row["rss"] < 10_000
    assert memory_probe.main([str(path)]) == 0


def test_mimallocs_printed_statistics_give_its_committed_bytes_and_current_pages() -> None:
    text = b"""subproc 0
 pages           peak       total     current       block      total#
  touched   :     0           0           0                                ok
  pages     :   912         4.4 K       388
  abandoned :     1.2 K       3.0 M       1.5 K
  reclaima  :     0
 arenas          peak       total     current       block      total#
  reserved  :     1.0 GiB     1.0 GiB     1.0 GiB
  committed :   863.2 MiB     2.1 GiB   524.5 MiB
  purged    :     0
  purges    :    31
"""
    assert memory_probe.parse_mimalloc_stats(text) == {
        "mimalloc_committed": int(524.5 * 2**20),
        "mimalloc_pages": 388,
        "mimalloc_abandoned": 1500,
        "mimalloc_purges": 31,
    }
    assert memory_probe.parse_mimalloc_stats(b"") == {}


def test_jemallocs_printed_totals_give_what_it_keeps_resident_against_what_it_hands_out() -> None:
    text = (
        b"___ Begin jemalloc statistics ___\n  opt.narenas: 8\n"
        b"Allocated: 8482816, active: 8495104, metadata: 2696464 (n_thp 0), resident: 11169792, "
        b"mapped: 14852096, retained: 4022272\nBackground threads: 1\n"
    )
    assert memory_probe.parse_jemalloc_stats(text) == {
        "jemalloc_allocated": 8482816,
        "jemalloc_active": 8495104,
        "jemalloc_metadata": 2696464,
        "jemalloc_resident": 11169792,
        "jemalloc_mapped": 14852096,
        "jemalloc_retained": 4022272,
    }
    assert memory_probe.parse_jemalloc_stats(b"mimalloc stats") == {}


def test_smaps_anonymous_memory_is_split_by_kind_of_mapping() -> None:
    text = "\n".join(
        [
            "55d0c0000000-55d0c0100000 rw-p 00000000 00:00 0                          [heap]",
            "Size:               1024 kB",
            "Anonymous:           400 kB",
            "7f0004000000-7f0008000000 rw-p 00000000 00:00 0 ",  # a glibc thread arena: 64 MiB aligned
            "Anonymous:          2048 kB",
            "7f0008201000-7f0008400000 rw-p 00000000 00:00 0 ",
            "Anonymous:           100 kB",
            "7f0040000000-7f0080000000 rw-p 00000000 00:00 0 ",  # a 1 GiB reservation (mimalloc)
            "Anonymous:          5000 kB",
            "7f0009000000-7f0009100000 r--p 00000000 08:01 42                         /usr/lib/libc.so.6",
            "Anonymous:             8 kB",
            "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]",
            "Anonymous:            12 kB",
        ]
    )
    assert memory_probe.parse_smaps_anon(text) == {
        "smaps_heap": 400 * 1024,
        "smaps_stack": 12 * 1024,
        "smaps_anon_64m": 2048 * 1024,
        "smaps_anon_reserved": 5000 * 1024,
        "smaps_anon_other": 100 * 1024,
    }


def test_pymallocs_arenas_are_counted_at_the_size_cpython_prints() -> None:
    text = (
        b"# arenas allocated current           =                    3\n"
        b"3 arenas * 1048576 bytes/arena     =            3,145,728\n"
    )
    assert memory_probe.parse_pymalloc_arenas(text) == 3 * 1048576
    # and the probe reads this interpreter's own statistics the same way
    assert (memory_probe._pymalloc_arenas() or 0) % 1048576 == 0


def test_the_committers_log_lookups_are_counted_once_wrapped(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from sinks import committer

    monkeypatch.setattr(committer, "logged_events", lambda table, ids, cache=None: {i: True for i in ids})
    monkeypatch.setattr(memory_probe, "LOG_LOOKUPS", {"calls": 0, "ids": 0, "seconds": 0.0})
    memory_probe._count_log_lookups()
    memory_probe._count_log_lookups()  # a second install wraps nothing more
    assert committer.logged_events(None, {"a", "b"}) == {"a": True, "b": True}
    assert memory_probe.LOG_LOOKUPS["calls"] == 1
    assert memory_probe.LOG_LOOKUPS["ids"] == 2


def test_the_traced_top_names_the_line_that_holds_the_most_python_memory() -> None:
    import tracemalloc

    from bench.memory_probe import traced_top

    tracemalloc.start(1)
    try:
        held = [bytes(1000) + bytes([i % 256]) for i in range(5000)]  # ~5 MB from this line
        top = traced_top(tracemalloc.take_snapshot(), limit=3)
    finally:
        tracemalloc.stop()
    assert top[0]["where"] == [f"test_bench_memory_probe.py:{held_line()}"]
    assert top[0]["blocks"] >= 5000 and top[0]["mib"] >= 4.5
    assert len(held) == 5000


def held_line() -> int:
    import inspect

    src, first = inspect.getsourcelines(test_the_traced_top_names_the_line_that_holds_the_most_python_memory)
    return first + next(i for i, line in enumerate(src) if "held = [" in line)
