"""The projections' compaction policy alone, partitioned against unpartitioned, over many flushes.

    python -m bench.small_files_model --flushes 46 300 1000 --partitions 12 1
    python -m bench.small_files_model --keys-axis --partitions 3 1 --seeds 1 2 3

No table, no I/O: each flush adds one data file per partition (its rows split evenly over
``--partitions``, as a flush of random keys touches every type and bucket), then
:meth:`sinks.compaction.Compaction.pick` (the policy the committer runs) chooses what to merge and
the merged rows come back as one file per partition (``--tiers rows``: its size tiers counted in
rows, ``Compaction.tiers_in_rows``, not the default). ``--writer one-file`` models the projections'
writer since 2026-12-01 late night: a small flush writes one file under the unpartitioned spec
(its own group), and a merge of those files writes their rows into the partitions, one file
each (not under a bucketed spec: the 12-partition default stays per partition). A file's size is
``--footer-bytes`` plus ``--row-bytes`` per row (a small projection file's Parquet footer and rows, measured in
docs/benchmarks.md, "Keys axis" and "2026-12-01 night"). ``--flush-rows`` sizes the flushes (each
drawn from ``[rows/5, 9·rows/5]`` with ``--seeds``, or all equal with ``--seeds 0``);
``--keys-axis`` replays the keys axis's flushes instead (``bench.keys_seeded`` at 1M keys on a
quiet box: ``--preload`` flushes of ``--preload-rows``, then ``--flushes`` flushes of the 1,000/s
latency phase, 50-500 rows). Deletes are left out (random updates over 1M keys rarely empty a
file); the flush's deleted rows only size the budget, as in a real flush.

Printed per row written, so that partition counts compare: rows and bytes superseded, and the
floor under the bytes that no merge policy can go below while it bounds the files (each flush
file is superseded once: ``partitions`` footers and the rows a flush wrote); files left, and the
most one partition held after a flush (what a read of one partition plans).
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from itertools import count

import pyarrow as pa
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from sinks.compaction import Compaction
from sinks.rowdelta import LiveFile, TableState


def flush_sizes(rows: int, flushes: int, seed: int) -> list[int]:
    """``flushes`` flush sizes around ``rows`` (all ``rows`` with seed 0). Pure."""
    if not seed:
        return [rows] * flushes
    rnd = random.Random(seed)
    return [rnd.randint(max(1, rows // 5), rows * 9 // 5) for _ in range(flushes)]


def keys_axis(preload: int, preload_rows: int, flushes: int, seed: int) -> list[int]:
    """The keys axis's flushes at 1M keys: the preload's few large ones, then the latency phase's."""
    rnd = random.Random(seed)
    return [preload_rows] * preload + [rnd.randint(50, 500) for _ in range(flushes)]


#: The partition of the files a small flush writes under the unpartitioned spec (``--writer one-file``).
UNPARTITIONED = -1


def run(
    partitions: int,
    flushes: list[int],
    seed_rows: int,
    footer: int,
    row_bytes: int,
    tiers_in_rows: bool = False,
    one_file: bool = False,
) -> Counter[str]:
    """Rows and bytes written and superseded by ``flushes`` (rows each), and the files left.

    With ``one_file`` (and more than one partition) each flush writes one file under the
    unpartitioned spec instead of one per partition.
    """
    policy = Compaction(64 * 1024 * 1024, 100, tiers_in_rows=tiers_in_rows)
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
        df.spec_id = 0 if bucket == UNPARTITIONED else 1  # its own (spec, partition) group
        files[path] = LiveFile(df, nothing)
        return int(df.file_size_in_bytes)

    for bucket in range(partitions):  # the seed: one file per partition
        add(bucket, seed_rows // partitions)
    for flush_rows in flushes:
        if one_file and partitions > 1:
            out["bytes_written"] += add(UNPARTITIONED, flush_rows)
        else:
            for bucket in range(partitions):
                out["bytes_written"] += add(bucket, flush_rows // partitions)
        out["rows_written"] += flush_rows
        # The flush's own deletes size the budget (2 x rows deleted); they name no file here.
        merged: dict[int, int] = {}
        for path, _ in policy.pick(TableState(files=files), {"(elsewhere)": list(range(flush_rows))}):
            df = files.pop(path).data_file
            out["rows_superseded"] += df.record_count
            out["bytes_superseded"] += df.file_size_in_bytes
            out["files_superseded"] += 1
            merged[df.partition[0]] = merged.get(df.partition[0], 0) + df.record_count
        for bucket, rows in merged.items():
            if bucket == UNPARTITIONED:  # rewritten into the partitions: the rows of each
                for b in range(partitions):
                    add(b, rows // partitions)
            else:
                add(bucket, rows)
        held = Counter(live.data_file.partition[0] for live in files.values())
        out["most_in_a_partition"] = max(out["most_in_a_partition"], max(held.values()))
    out["files"] = len(files)
    out["flushes"] = len(flushes)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flushes", type=int, nargs="+", default=[46, 300, 1000])
    p.add_argument("--partitions", type=int, nargs="+", default=[12, 1], help="12 = 3 types x 4 buckets")
    p.add_argument("--flush-rows", type=int, default=500, help="rows a flush writes (the latency phase's ~500)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="flush sizes drawn at random; 0: all equal")
    p.add_argument("--keys-axis", action="store_true", help="the keys axis's flushes (--flushes: latency phase)")
    p.add_argument("--preload", type=int, default=5, help="--keys-axis: the preload's flushes")
    p.add_argument("--preload-rows", type=int, default=20_000)
    p.add_argument("--seed-rows", type=int, default=1_000_000)
    p.add_argument("--footer-bytes", type=int, default=3_300)
    p.add_argument("--row-bytes", type=int, default=50)
    p.add_argument("--tiers", choices=("bytes", "rows"), default="bytes", help="Compaction.tiers_in_rows")
    p.add_argument(
        "--writer",
        choices=("per-partition", "one-file"),
        default="per-partition",
        help="one-file: a small flush writes one file under the unpartitioned spec (the projections' writer)",
    )
    a = p.parse_args()
    print(
        "flushes seed partitions | rows superseded per row written | bytes superseded per row written "
        "(floor) | files superseded | files left | most in a partition"
    )
    for n in a.flushes:
        for seed in a.seeds:
            for parts in a.partitions:
                sizes = (
                    keys_axis(a.preload, a.preload_rows, n, seed) if a.keys_axis else flush_sizes(a.flush_rows, n, seed)
                )
                one_file = a.writer == "one-file"
                o = run(parts, sizes, a.seed_rows, a.footer_bytes, a.row_bytes, a.tiers == "rows", one_file)
                footers = 1 if one_file else parts
                floor = (footers * a.footer_bytes * len(sizes) + a.row_bytes * sum(sizes)) / sum(sizes)
                print(
                    f"{n:7d} {seed:4d} {parts:10d} | {o['rows_superseded'] / o['rows_written']:31.3f} |"
                    f" {o['bytes_superseded'] / o['rows_written']:14.2f} ({floor:6.2f} at steady state) |"
                    f" {o['files_superseded']:16d} | {o['files']:10d} | {o['most_in_a_partition']:19d}"
                )


if __name__ == "__main__":
    main()
