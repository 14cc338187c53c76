"""FileCache (sinks/rowdelta.py): its byte bound must bound the memory its entries keep alive."""

from __future__ import annotations

import pyarrow as pa

from sinks.rowdelta import FileCache


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
    bound = 2 * batch.slice(0, per_file).nbytes + 1024
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
