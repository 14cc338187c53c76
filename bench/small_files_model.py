"""The projections' compaction policy alone, partitioned against unpartitioned, over many flushes.

    python -m bench.small_files_model --flushes 46 300 1000 --partitions 12 1

No table, no I/O: each flush adds one data file per partition (``--flush-rows`` split evenly over
``--partitions``, as a flush of random keys touches every (type, bucket)), then
:meth:`sinks.compaction.Compaction.pick` (the policy the committer runs) chooses what to merge and
the merged rows come back as one file per partition. A file's size is ``--footer-bytes`` plus
``--row-bytes`` per row (a small projection file's Parquet footer and rows, measured in
docs/benchmarks.md, "Keys axis"). It prints rows and bytes superseded per row and byte written by
the flushes, and the files left: what the keys axis's 100k updates sample of the policy, without the
load's say in how many flushes there are. Deletes are left out (random updates over 1M keys rarely
empty a file); the flush's deleted rows only size the budget, as in a real flush.
"""

from __future__ import annotations

import argparse
from collections import Counter
from itertools import count

import pyarrow as pa
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from sinks.compaction import Compaction
from sinks.rowdelta import LiveFile, TableState


def run(partitions: int, flushes: int, flush_rows: int, seed_rows: int, footer: int, row_bytes: int) -> Counter[str]:
    """Rows and bytes written and superseded by ``flushes`` flushes, and the files left."""
    policy = Compaction(64 * 1024 * 1024, 100)
    ids = count()
    nothing = pa.array([], pa.int64())
    files: dict[str, LiveFile] = {}
    out: Counter[str] = Counter()

    def add(bucket: int, rows: int) -> int:
        path = f"f{next(ids):07d}"
        df = DataFile.from_args(
            content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
            partition=Record(bucket), record_count=rows, file_size_in_bytes=footer + row_bytes * rows,
        )  # fmt: skip
        df.spec_id = 1
        files[path] = LiveFile(df, nothing)
        return int(df.file_size_in_bytes)

    for bucket in range(partitions):  # the seed: one file per partition
        add(bucket, seed_rows // partitions)
    for _ in range(flushes):
        for bucket in range(partitions):
            out["bytes_written"] += add(bucket, flush_rows // partitions)
        out["rows_written"] += flush_rows
        # The flush's own deletes size the budget (2 x rows deleted); they name no file here.
        merged: dict[int, int] = {}
        for path, _ in policy.pick(TableState(files=files), {"(elsewhere)": list(range(flush_rows))}):
            df = files.pop(path).data_file
            out["rows_superseded"] += df.record_count
            out["bytes_superseded"] += df.file_size_in_bytes
            merged[df.partition[0]] = merged.get(df.partition[0], 0) + df.record_count
        for bucket, rows in merged.items():
            add(bucket, rows)
    out["files"] = len(files)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flushes", type=int, nargs="+", default=[46, 300, 1000])
    p.add_argument("--partitions", type=int, nargs="+", default=[12, 1], help="12 = 3 types x 4 buckets")
    p.add_argument("--flush-rows", type=int, default=500, help="rows a flush writes (the latency phase's ~500)")
    p.add_argument("--seed-rows", type=int, default=1_000_000)
    p.add_argument("--footer-bytes", type=int, default=3_300)
    p.add_argument("--row-bytes", type=int, default=50)
    a = p.parse_args()
    print("flushes partitions | rows superseded per row written | bytes per byte written | files left")
    for n in a.flushes:
        for parts in a.partitions:
            o = run(parts, n, a.flush_rows, a.seed_rows, a.footer_bytes, a.row_bytes)
            print(
                f"{n:7d} {parts:10d} | {o['rows_superseded'] / o['rows_written']:31.3f} |"
                f" {o['bytes_superseded'] / o['bytes_written']:22.3f} | {o['files']:10d}"
            )


if __name__ == "__main__":
    main()
