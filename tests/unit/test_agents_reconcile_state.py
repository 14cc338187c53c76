"""Reconciliation's checkpoint (agents/reconcile_state.py): the incremental fold agrees with the full
replay (``derive``/``expected``), files are read once, and the comparison finds every kind of drift."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import orjson
import pyarrow as pa

from agents.reconcile_plan import Row, derive, expected
from agents.reconcile_state import (
    LOG_COLUMNS,
    PROJECTION_COLUMNS,
    SEP,
    Checkpoint,
    FileInfo,
    live_counts,
    mismatched_keys,
    split_key,
)

LOG_TYPES = {
    "kind": pa.string(),
    "applied": pa.bool_(),
    "entity_type": pa.string(),
    "entity_pk": pa.string(),
    "change_type": pa.string(),
    "version": pa.int64(),
    "event_id": pa.string(),
    "committed_at": pa.timestamp("us", tz="UTC"),
    "batch_seq": pa.int32(),
    "after_properties": pa.string(),
}


class Files:
    """Data files by path (what the checkpoint's read callbacks see) and a counter of reads."""

    def __init__(self) -> None:
        self.data: dict[str, pa.Table] = {}
        self.deletes: dict[str, dict[str, pa.Array]] = {}
        self.reads = 0

    def read(self, path: str, cols: tuple[str, ...]) -> pa.Table:
        self.reads += 1
        t = self.data[path]
        return t.select([c for c in cols if c in t.column_names])

    def deletes_of(self, path: str) -> Mapping[str, pa.Array]:
        return self.deletes[path]

    def infos(self, paths: list[str], deletes: Mapping[str, frozenset[str]] | None = None) -> list[FileInfo]:
        return [FileInfo(p, self.data[p].num_rows, (deletes or {}).get(p, frozenset())) for p in paths]


def log_file(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table({c: pa.array([r.get(c) for r in rows], LOG_TYPES[c]) for c in LOG_COLUMNS})


def ev(n: int, typ: str, pk: str, version: int, change: str = "UPDATE", *, at: int, applied: bool = True) -> dict:
    return {
        "kind": "object",
        "applied": applied,
        "entity_type": typ,
        "entity_pk": pk,
        "change_type": change,
        "version": version,
        "event_id": f"e{n}",
        "committed_at": at * 1_000_000,
        "batch_seq": n % 10,  # position in its commit (ten events per commit)
        "after_properties": None if change in ("DELETE", "TRUNCATE") else orjson.dumps({"n": n}).decode(),
    }


def replayed(rows: list[dict[str, Any]]) -> dict[tuple[str, str], Row]:
    """What the old full replay decided: commit order (committed_at, batch_seq, read order)."""
    applied = [r for r in rows if r["applied"] and r["kind"] == "object"]
    ordered = [
        r for _, r in sorted(enumerate(applied), key=lambda ir: (ir[1]["committed_at"], ir[1]["batch_seq"], ir[0]))
    ]
    return expected(derive(ordered))


def folded(point: Checkpoint) -> dict[tuple[str, str], Row]:
    return {
        split_key(r["key"]): Row(r["version"], r["deleted"], r["event_id"], r["digest"])
        for r in point.wanted.to_pylist()
    }


def random_log(seed: int, n: int, keys: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        at = i // 10  # ten events per commit
        if rnd.random() < 0.01:
            out.append(ev(i, "T", "*", 0, "TRUNCATE", at=at))
            continue
        change = rnd.choice(["CREATE", "UPDATE", "UPDATE", "DELETE"])
        out.append(
            ev(i, rnd.choice(["T", "U"]), f"k{rnd.randrange(keys)}", i, change, at=at, applied=rnd.random() > 0.05)
        )
    return out


def test_the_incremental_fold_decides_what_the_full_replay_decides() -> None:
    rows = random_log(1, 3000, 200)
    files = Files()
    point = Checkpoint()
    paths: list[str] = []
    for i in range(0, len(rows), 250):  # a file per commit group, folded a few at a time
        paths.append(f"log{i}")
        files.data[paths[-1]] = log_file(rows[i : i + 250])
        if i % 750 == 0:
            point.advance_log(files.infos(paths), files.read)
            assert folded(point) == replayed(rows[: i + 250])
    point.advance_log(files.infos(paths), files.read)
    assert folded(point) == replayed(rows)


def two_files_folded(rows: list[dict[str, Any]]) -> tuple[Files, Checkpoint]:
    """The log ``rows`` in two files "a" and "b", folded."""
    files = Files()
    half = len(rows) // 2
    files.data = {"a": log_file(rows[:half]), "b": log_file(rows[half:])}
    point = Checkpoint()
    point.advance_log(files.infos(["a", "b"]), files.read)
    return files, point


def test_a_compacted_log_is_read_once_and_digests_nothing() -> None:
    rows = random_log(2, 2000, 300)
    files, point = two_files_folded(rows)
    before = folded(point)
    # compaction: both files rewritten into one, sorted by key (another read order)
    merged = log_file(sorted(rows, key=lambda r: (r["entity_type"], r["entity_pk"], r["version"])))
    files.data["ab"] = merged
    point.digested = 0
    point.advance_log(files.infos(["ab"]), files.read)
    assert folded(point) == before and point.digested == 0
    # a new flush: only its rows are read and digested
    new = [ev(5000 + i, "U", f"new{i}", 1, "CREATE", at=10_000) for i in range(40)]
    files.data["c"] = log_file(new)
    files.reads = point.digested = 0
    point.advance_log(files.infos(["ab", "c"]), files.read)
    assert files.reads == 1 and point.digested == 40
    assert folded(point) == replayed(rows + new)


def test_a_log_that_lost_rows_is_folded_again() -> None:
    rows = random_log(3, 600, 50)
    files, point = two_files_folded(rows)
    point.advance_log(files.infos(["a"]), files.read)  # rolled back to before "b"
    assert folded(point) == replayed(rows[:300])


def proj_file(rows: list[tuple[str, str, int, bool, str, str | None]]) -> pa.Table:
    cols = list(zip(*rows, strict=True))
    types = [pa.string(), pa.string(), pa.int64(), pa.bool_(), pa.string(), pa.string()]
    return pa.table({c: pa.array(list(v), t) for c, v, t in zip(PROJECTION_COLUMNS, cols, types, strict=True)})


def test_the_comparison_finds_missing_extra_duplicate_other_writer_and_other_contents() -> None:
    log = [ev(i, "T", f"k{i}", 1, "CREATE", at=1) for i in range(6)] + [ev(6, "T", "k5", 2, "DELETE", at=2)]
    files = Files()
    files.data["log"] = log_file(log)
    p = [orjson.dumps({"n": i}).decode() for i in range(6)]
    files.data["p1"] = proj_file([
        ("T", "k0", 1, False, "e0", p[0]),  # agrees
        ("T", "k1", 1, False, "e1", '{"n":99}'),  # other contents
        ("T", "k2", 1, False, "eX", p[2]),  # other writer
        ("T", "k3", 1, False, "e3", p[3]),  # duplicated in p2
        ("T", "k5", 2, True, "e6", None),  # tombstone, agrees
        ("T", "zz", 1, False, "e9", "{}"),  # extra
    ])  # fmt: skip
    files.data["p2"] = proj_file([("T", "k3", 1, False, "e3", p[3]), ("T", "k4", 1, False, "e4", p[4])])
    files.deletes["d"] = {"p2": pa.array([1], pa.int64())}  # k4's row deleted: missing
    point = Checkpoint()
    point.advance_log(files.infos(["log"]), files.read)
    point.advance_projection(files.infos(["p1", "p2"], {"p2": frozenset({"d"})}), files.read, files.deletes_of)
    live, _ = point.projection()
    assert {split_key(k)[1] for k in mismatched_keys(live, point.wanted)} == {"k1", "k2", "k3", "k4", "zz"}
    assert {split_key(k)[1] for k in point.differing(live)} == {"k1", "k2", "k3", "k4", "zz"}
    assert live_counts(live) == {"T": 6} and live_counts(point.wanted) == {"T": 5}
    # the delete goes away (merged into another file that masks nothing): k4 is back and agrees
    files.deletes["d2"] = {}
    files.reads = point.digested = 0
    point.advance_projection(files.infos(["p1", "p2"], {"p2": frozenset({"d2"})}), files.read, files.deletes_of)
    assert files.reads == 0 and point.digested == 0  # no data file re-read
    live, _ = point.projection()
    assert {split_key(k)[1] for k in point.differing(live)} == {"k1", "k2", "k3", "zz"}
    # k0's row deleted by a new delete file, behind the worker's back: found among the changed keys
    files.deletes["d3"] = {"p1": pa.array([0], pa.int64())}
    point.advance_projection(
        files.infos(["p1", "p2"], {"p1": frozenset({"d3"}), "p2": frozenset({"d2"})}), files.read, files.deletes_of
    )
    live, _ = point.projection()
    assert point.dirty == {f"T{SEP}{k}" for k in ("k0", "k1", "k2", "k3", "zz")}
    assert {split_key(k)[1] for k in point.differing(live)} == {"k0", "k1", "k2", "k3", "zz"}


def test_one_row_folds() -> None:
    files = Files()
    files.data["a"] = log_file([ev(1, "T", "k", 1, "CREATE", at=1)])
    point = Checkpoint()
    point.advance_log(files.infos(["a"]), files.read)
    assert folded(point) == replayed([ev(1, "T", "k", 1, "CREATE", at=1)])
