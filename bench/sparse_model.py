"""The projections' compaction policy with deletes, by where a rewrite's rows are written.

    python -m bench.sparse_model --keys 1000 --updates 144
    python -m bench.sparse_model --keys 10000 --updates 144 --flushes 1000

No table, no I/O. A world of ``--keys`` keys over ``--types`` types (a key keeps its type) is
seeded with one flush of every key, then each flush updates ``--updates`` random keys: it writes
them as one file under the unpartitioned spec (a small flush, ``writes_one_file``), masks their
old rows, and :meth:`sinks.compaction.Compaction.picks` (the policy the committer runs) chooses
the files it rewrites. Rules for where the rewritten rows go:

* ``by-partition``: all of them to a file per type (the writer before 2026-12-02 early morning);
* ``picks``: the policy's own split (``with_flush`` into the flush's one file, the rest by type);
* ``all-sparse``: every file rewritten for its deletes into the flush's one file;
* ``budget``: as ``all-sparse`` when those rows fit the flush's budget, else by type.

Printed per flush after ``--warmup`` flushes: data files and position-delete files written (one
per (spec, partition) deleted from and not removed), (content, spec) manifests, rows rewritten,
live data files.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter, defaultdict
from itertools import count

import pyarrow as pa
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from sinks.compaction import Compaction
from sinks.rowdelta import LiveFile, TableState

RULES = ("by-partition", "picks", "all-sparse", "budget")


def run(
    rule: str,
    keys: int,
    updates: int,
    flushes: int,
    warmup: int = 50,
    types: int = 3,
    seed: int = 1,
    row_bytes: int = 60,
    footer: int = 3_300,
) -> dict[str, float]:
    """Means per flush after ``warmup`` (see the module's text)."""
    rng = random.Random(seed)
    policy = Compaction(64 * 1024 * 1024, 100)
    ids = count()
    files: dict[str, tuple[int, tuple[int, ...], list[int], set[int]]] = {}  # spec, partition, keys, dead
    where: dict[int, tuple[str, int]] = {}
    out: Counter[str] = Counter()

    def add(spec: int, partition: tuple[int, ...], rows: list[int]) -> None:
        path = f"f{next(ids):07d}"
        files[path] = (spec, partition, rows, set())
        for i, k in enumerate(rows):
            where[k] = (path, i)

    def live(path: str) -> LiveFile:
        spec, partition, rows, dead = files[path]
        df = DataFile.from_args(
            content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
            partition=Record(*partition), record_count=len(rows), file_size_in_bytes=footer + row_bytes * len(rows),
        )  # fmt: skip
        df.spec_id = spec
        return LiveFile(df, pa.array(sorted(dead), pa.int64()))

    def rows_of(picked: list[tuple[str, set[int]]]) -> list[int]:
        return [k for p, dead in picked for i, k in enumerate(files[p][2]) if i not in dead]

    add(1, (), list(range(keys)))
    for n in range(flushes):
        updated = rng.sample(range(keys), updates)
        deletes: dict[str, list[int]] = defaultdict(list)
        for k in updated:
            path, pos = where[k]
            deletes[path].append(pos)
        with_flush, by_partition = policy.picks(TableState(files={p: live(p) for p in files}), dict(deletes))
        picked = with_flush + by_partition
        if rule == "by-partition":
            joining, rest = [], picked
        elif rule == "picks":
            joining, rest = with_flush, by_partition
        else:
            sparse = [c for c in picked if len(files[c[0]][3] | set(deletes.get(c[0], ()))) * 2 > len(files[c[0]][2])]
            joining = sparse if rule == "all-sparse" or len(rows_of(sparse)) <= 2 * updates else []
            rest = [c for c in picked if c not in joining]
        carried, moved = rows_of(joining), rows_of(rest)
        removed = {p for p, _ in picked}
        masked = {files[p][:2] for p in deletes if p not in removed}
        for p, positions in deletes.items():
            if p not in removed:
                files[p][3].update(positions)
        for p in removed:
            del files[p]
        add(1, (), updated + carried)
        by_type: dict[int, list[int]] = defaultdict(list)
        for k in moved:
            by_type[k % types].append(k)
        for t, rows in by_type.items():
            add(0, (t,), rows)
        if n >= warmup:
            out["flushes"] += 1
            out["data files"] += 1 + len(by_type)
            out["delete files"] += len(masked)
            out["manifests"] += 1 + bool(by_type) + len({spec for spec, _ in masked})
            out["rows rewritten"] += len(carried) + len(moved)
            out["live data files"] += len(files)
    done = out.pop("flushes")
    return {k: round(v / done, 2) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--updates", type=int, default=144, help="random keys a flush updates")
    p.add_argument("--flushes", type=int, default=300)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rules", nargs="+", choices=RULES, default=list(RULES))
    args = p.parse_args()
    for rule in args.rules:
        print(rule, run(rule, args.keys, args.updates, args.flushes, args.warmup, seed=args.seed))


if __name__ == "__main__":
    main()
