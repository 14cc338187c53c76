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
