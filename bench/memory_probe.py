"""Where a running worker's memory is, every ``interval`` seconds, under a benchmark's own load.

The soak's RSS figure says how much, not who holds it. This probe is loaded into the worker only,
through ``bench/worker_probe/sitecustomize.py`` (``python -m bench soak --probe DIR`` sets it up)::

    BENCH_MEMORY_PROBE=/tmp/mem.jsonl PYTHONPATH=$PWD/bench/worker_probe:$PWD python -m bench soak ...
    python -m bench.memory_probe /tmp/mem.jsonl          # a table at minutes 1, 3, 5, 8, ...

Each sample (one JSON line) holds the process's RSS and anonymous memory, Arrow's live bytes (its
default pool, mimalloc here, and the system pool), glibc malloc's in-use and free bytes, pymalloc's
arenas, and the size of every bounded holder the worker has: the key-index cache (entries, the bytes
it counts, the bytes its buffers really hold), its full-row share and delete splits, the manifest
entry and manifest list caches, the causal gate, the applier's held records and batches, and
aiokafka's fetched-but-unread records. Holders are found by wrapping their ``__init__`` (weak
references: the probe keeps nothing alive), so the probe must be imported before the worker builds them.
``BENCH_MEMORY_PROBE_TRACE_FRAMES=N`` also traces Python's allocations (``tracemalloc``, N frames) and
adds the 30 sites holding the most bytes to every census sample (``traced``): severalfold slower.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import gc
import json
import os
import re
import sys
import tempfile
import threading
import time
import tracemalloc
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

ENV = "BENCH_MEMORY_PROBE"
INTERVAL_ENV = "BENCH_MEMORY_PROBE_INTERVAL"
MIB = 2**20

_instances: dict[str, weakref.WeakSet[Any]] = {}


def _register(cls: type, name: str) -> None:
    """Remember every ``cls`` built from now on under ``name`` (weakly)."""
    seen: weakref.WeakSet[Any] = _instances.setdefault(name, weakref.WeakSet())
    init = cls.__init__  # type: ignore[misc]
    if getattr(init, "_memory_probe", False):
        return  # already wrapped

    def __init__(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        seen.add(self)

    __init__._memory_probe = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def _live(name: str) -> list[Any]:
    return list(_instances.get(name, ()))


# --- process-level figures ------------------------------------------------------------------------


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "RssAnon:", "RssFile:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _mallinfo() -> dict[str, int]:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    # arena: sbrk heap; hblkhd: mmapped blocks. uordblks in use, fordblks free but kept.
    return {"malloc_in_use": m.uordblks + m.hblkhd, "malloc_free": m.fordblks}


_ARENAS = re.compile(rb"# arenas allocated current\s*=\s*([\d,]+)")
#: "3 arenas * 1048576 bytes/arena": an arena is 1 MiB on 64-bit CPython 3.10+ (256 KiB before).
_ARENA_SIZE = re.compile(rb"arenas \* ([\d,]+) bytes/arena")
_COMMITTED = re.compile(rb"committed\s*:\s*\S+ \S+\s+\S+ \S+\s+([\d.]+) (\w+)")
_UNITS = {b"B": 1, b"KiB": 2**10, b"MiB": 2**20, b"GiB": 2**30}


def _captured(fn: Any) -> bytes:
    """What ``fn`` (C code) writes to fd 1 and 2."""
    with tempfile.TemporaryFile() as tmp:
        saved = [os.dup(1), os.dup(2)]
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            fn()
        finally:
            for fd, old in zip((1, 2), saved, strict=True):
                os.dup2(old, fd)
                os.close(old)
        tmp.seek(0)
        return tmp.read()


def parse_pymalloc_arenas(text: bytes) -> int | None:
    """Bytes of pymalloc's arenas now mapped, from ``sys._debugmallocstats`` (pure): the current
    count times the printed arena size (1 MiB here: until 2026-12-03 the probe assumed 256 KiB and
    reported a quarter of pymalloc's memory)."""
    found = _ARENAS.search(text)
    if not found:
        return None
    size = _ARENA_SIZE.search(text)
    return int(found.group(1).replace(b",", b"")) * (int(size.group(1).replace(b",", b"")) if size else 256 * 1024)


def _pymalloc_arenas() -> int | None:
    return parse_pymalloc_arenas(_captured(sys._debugmallocstats))


#: mimalloc 3's page counters (``mi_stats_print``): ``pages`` in use now, those ``abandoned`` (a thread
#: gives up a page once it is full, or when it exits; any thread may reclaim it later), and the
#: ``purges`` of free arena memory handed back so far. A page with one live block stays committed.
_MI_COUNTS = re.compile(rb"^\s*(pages|abandoned|purges)\s*:\s*(.*)$", re.MULTILINE)
_MI_COUNT = re.compile(rb"(\d+(?:\.\d+)?)(?: ([KMG])\b)?")


def parse_mimalloc_stats(text: bytes) -> dict[str, int]:
    """The committed bytes and page counters in mimalloc's printed statistics (absent when not printed).

    Pure. A counter with peak, total and current columns gives its current one; one with a single
    column (``purges``) gives that.
    """
    out: dict[str, int] = {}
    found = _COMMITTED.search(text)
    if found:
        out["mimalloc_committed"] = int(float(found.group(1)) * _UNITS.get(found.group(2), 1))
    for name, rest in _MI_COUNTS.findall(text):
        # a count of 1,000 or more is printed "1.2 K" (and M, G: powers of 1,000)
        numbers = [float(n) * 1000 ** b" KMG".index(m or b" ") for n, m in _MI_COUNT.findall(rest)]
        if numbers:
            out[f"mimalloc_{name.decode()}"] = round(numbers[2] if len(numbers) >= 3 else numbers[0])
    return out


def _used_pool(name: str) -> Any:
    """Arrow's ``name`` pool if this pyarrow has it and anything has allocated from it, else None.
    Read whichever pool is pyarrow's default: Arrow's C++ code allocates from the pool libarrow
    chose when it loaded, which ``pa.set_memory_pool`` does not change."""
    import pyarrow as pa

    try:
        pool = getattr(pa, f"{name}_memory_pool")()
    except NotImplementedError:
        return None
    return pool if pool.max_memory() else None


def _mimalloc() -> dict[str, int]:
    """Arrow's mimalloc now: committed bytes (live allocations plus what it keeps) and its pages."""
    pool = _used_pool("mimalloc")
    if pool is None:
        return {}
    return {"mimalloc_live": pool.bytes_allocated(), **parse_mimalloc_stats(_captured(pool.print_stats))}


#: jemalloc's totals line (``malloc_stats_print``): what it hands out, the pages of those runs, its own
#: metadata, what is resident, mapped, and kept mapped but handed back (retained).
_JE_TOTALS = re.compile(
    rb"Allocated: (\d+), active: (\d+), metadata: (\d+)(?: \(n_thp \d+\))?, resident: (\d+), mapped: (\d+), "
    rb"retained: (\d+)"
)


def parse_jemalloc_stats(text: bytes) -> dict[str, int]:
    """The totals in jemalloc's printed statistics (pure; absent when not printed)."""
    found = _JE_TOTALS.search(text)
    if not found:
        return {}
    names = ("allocated", "active", "metadata", "resident", "mapped", "retained")
    return {f"jemalloc_{n}": int(v) for n, v in zip(names, found.groups(), strict=True)}


def _jemalloc() -> dict[str, int]:
    """Arrow's jemalloc now: resident bytes against those it hands out (what it keeps above live)."""
    pool = _used_pool("jemalloc")
    return parse_jemalloc_stats(_captured(pool.print_stats)) if pool is not None else {}


def parse_smaps_anon(text: str) -> dict[str, int]:
    """Anonymous resident bytes by kind of mapping in ``/proc/self/smaps`` (pure): the ``[heap]``
    (glibc's main arena), ``[stack]``, nameless mappings of at most 64 MiB that start on a 64 MiB
    boundary (``anon_64m``: glibc's thread arenas, each a heap of at most 64 MiB mapped there),
    nameless mappings of 256 MiB or more (``anon_reserved``: mimalloc reserves its arenas 1 GiB at a
    time), and ``anon_other`` for the rest (jemalloc's extents, pymalloc's arenas, thread stacks)."""
    out = {"smaps_heap": 0, "smaps_stack": 0, "smaps_anon_64m": 0, "smaps_anon_reserved": 0, "smaps_anon_other": 0}
    kind: str | None = None
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            name = head[5].strip() if len(head) > 5 else ""
            if name == "[heap]":
                kind = "smaps_heap"
            elif name.startswith("[stack"):
                kind = "smaps_stack"
            elif name:
                kind = None
            elif hi - lo >= 256 * 2**20:
                kind = "smaps_anon_reserved"
            elif lo % (64 * 2**20) == 0 and hi - lo <= 64 * 2**20:
                kind = "smaps_anon_64m"
            else:
                kind = "smaps_anon_other"
        elif line.startswith("Anonymous:") and kind:
            out[kind] += int(line.split()[1]) * 1024
    return out


def _smaps_anon() -> dict[str, int]:
    try:
        return parse_smaps_anon(Path("/proc/self/smaps").read_text())
    except OSError:
        return {}


_SYSTEM = re.compile(rb'<system type="current" size="(\d+)"/>')
_FREE = re.compile(rb'<total type="(fast|rest)" count="\d+" size="(\d+)"/>')
_MMAP = re.compile(rb'<total type="mmap" count="\d+" size="(\d+)"/>')


def _malloc_all_arenas() -> dict[str, int]:
    """glibc malloc over every arena (``mallinfo2`` only sees the main one; threads get their own)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.fopen.restype = ctypes.c_void_p
        with tempfile.NamedTemporaryFile() as tmp:
            fp = libc.fopen(tmp.name.encode(), b"w")
            libc.malloc_info(0, ctypes.c_void_p(fp))
            libc.fclose(ctypes.c_void_p(fp))
            xml = Path(tmp.name).read_bytes()
    except (OSError, AttributeError):
        return {}
    tail = xml[xml.rfind(b"</heap>") :]  # the totals after the last arena
    system = _SYSTEM.search(tail)
    mmap = _MMAP.search(tail)
    return {
        "malloc_arenas": xml.count(b"<heap nr="),
        "malloc_system": int(system.group(1)) if system else 0,
        "malloc_all_free": sum(int(m.group(2)) for m in _FREE.finditer(tail)),
        "malloc_mmap": int(mmap.group(1)) if mmap else 0,
    }


def release() -> dict[str, int]:
    """RSS before and after handing back what the allocators keep free (Arrow's pool, then glibc)."""
    import pyarrow as pa

    before = _status()["VmRSS"]
    pa.default_memory_pool().release_unused()
    after_arrow = _status()["VmRSS"]
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    after_trim = _status()["VmRSS"]
    return {
        "rss_before": before,
        "freed_by_arrow_release": before - after_arrow,
        "freed_by_malloc_trim": after_arrow - after_trim,
    }


def _arrow() -> dict[str, int]:
    import pyarrow as pa

    return {
        "arrow_total": pa.total_allocated_bytes(),
        "arrow_default_pool": pa.default_memory_pool().bytes_allocated(),
        "arrow_default_pool_peak": pa.default_memory_pool().max_memory() or 0,
        "arrow_system_pool": pa.system_memory_pool().bytes_allocated(),
    }


# --- holders -------------------------------------------------------------------------------------


def _buffers_bytes(tables: list[Any]) -> int:
    """Bytes of the distinct buffers ``tables`` keep alive (a slice keeps its parent's whole buffer)."""
    seen: dict[int, int] = {}
    for table in tables:
        for column in table.columns:
            for chunk in column.chunks:
                for buf in chunk.buffers():
                    if buf is not None:
                        seen[buf.address] = max(seen.get(buf.address, 0), buf.size)
    return sum(seen.values())


def _file_caches() -> list[dict[str, Any]]:
    out = []
    for cache in _live("file_cache"):
        with cache._lock:
            items = list(cache._items.values())
            rows = list(cache._rows.values())
            splits = list(cache._split.values())
            filters = len(cache._filters)
            by_column: Counter[str] = Counter()
            for (_, column), kf in cache._filters.items():
                by_column[column] += kf.nbytes
            counted, rows_counted, filters_counted = cache._bytes, cache._rows_bytes, cache._filters_bytes
        spill = cache.spill
        out.append(
            {
                "max_bytes": cache.max_bytes,
                "index_files": len(items),
                "index_bytes": counted,
                "index_buffers": _buffers_bytes(items),
                "rows_files": len(rows),
                "rows_bytes": rows_counted,
                "rows_buffers": _buffers_bytes(rows),
                "split_files": len(splits),
                "split_bytes": sum(a.nbytes for s in splits for a in s.values()),
                "filter_files": filters,
                "filter_bytes": filters_counted,
                "filter_bytes_by_column": dict(by_column),
                "spill_bytes": spill.bytes if spill is not None else 0,
                "spill_reads": spill.reads if spill is not None else 0,
                "spill_writes": spill.writes if spill is not None else 0,
            }
        )
    return out


#: The committer's lookups in a world's event log (causes, recorded offsets, copies): calls, ids
#: asked, seconds spent, counted by ``_count_log_lookups`` since the probe was installed.
LOG_LOOKUPS = {"calls": 0, "ids": 0, "seconds": 0.0}


def _count_log_lookups() -> None:
    from sinks import committer

    look = committer.logged_events
    if getattr(look, "_memory_probe", False):
        return

    def counted(table: Any, ids: set[str], cache: Any = None) -> dict[str, bool]:
        t0 = time.perf_counter()
        try:
            return look(table, ids, cache)
        finally:
            LOG_LOOKUPS["calls"] += 1
            LOG_LOOKUPS["ids"] += len(ids)
            LOG_LOOKUPS["seconds"] += time.perf_counter() - t0

    counted._memory_probe = True  # type: ignore[attr-defined]
    committer.logged_events = counted


def _manifest_caches() -> dict[str, Any]:
    from sinks import manifest_cache

    entries, lists = manifest_cache.CACHE, manifest_cache.LISTS
    with lists._lock:
        held = list(lists._items.values())
    return {
        "manifests_cached": len(entries._items),
        "manifest_entries": entries._entries,
        "manifest_hits": entries.hits,
        "manifest_misses": entries.misses,
        "lists_cached": len(held),
        "list_manifests": sum(len(x) for x in held),
        "list_reads": lists.reads,
    }


def _appliers() -> list[dict[str, Any]]:
    out = []
    for applier in _live("applier"):
        gate = applier.gate
        records = [r for per in list(applier._records.values()) for r in list(per.values())]
        out.append(
            {
                "gate_applied": len(gate._applied),
                "gate_parked": len(gate._parked),
                "gate_pending": len(gate._pending),
                "gate_deadlines": len(gate._deadlines),
                "gate_by_cause": len(gate._by_cause),
                "held_handles": sum(map(len, list(applier._handles.values()))),
                "held_records": len(records),
                "held_record_bytes": sum(len(r.value or b"") + len(r.key or b"") for r in records),
                "batched": applier.batches.size(),
                "cause_seen": len(applier._cause_seen),
                "parked_at": len(applier._parked_at),
                "backpressure": bool(applier.backpressure),
                "behind": bool(applier.behind),
            }
        )
    return out


def _consumers() -> list[dict[str, Any]]:
    out = []
    for consumer in _live("consumer"):
        fetcher = getattr(consumer, "_fetcher", None)
        records = dict(getattr(fetcher, "_records", None) or {})
        fetched = 0
        for result in records.values():
            try:  # aiokafka 0.14: FetchResult._partition_records._records is the fetch's record set
                fetched += result._partition_records._records.size_in_bytes()
            except AttributeError:
                pass
        try:
            paused = len(consumer.paused())
        except Exception:  # noqa: BLE001 - not started, or closed
            paused = -1
        out.append({"fetched_partitions": len(records), "fetched_bytes": fetched, "paused": paused})
    return out


def sample(census: bool = False) -> dict[str, Any]:
    t0 = time.process_time()
    doc: dict[str, Any] = {"t": round(time.time(), 1)}
    doc.update(_status())
    doc.update(_mallinfo())
    doc.update(_malloc_all_arenas())
    doc["mimalloc_committed"] = None
    doc.update(_mimalloc())
    doc.update(_jemalloc())
    doc.update(_smaps_anon())
    doc["threads"] = threading.active_count()
    doc["os_threads"] = len(os.listdir("/proc/self/task"))
    doc.update(_arrow())
    doc["pymalloc_blocks"] = sys.getallocatedblocks()
    doc["pymalloc_arenas"] = _pymalloc_arenas()
    doc["file_caches"] = _file_caches()
    # the log merges' shared budget: how often a merge waited for another world's, and the most held at once
    doc["native_budgets"] = [
        {"limit": b.limit, "in_use": b.in_use, "peak": b.peak, "waits": b.waits} for b in _live("native_budget")
    ]
    doc["manifests"] = _manifest_caches()
    doc["log_lookups"] = dict(LOG_LOOKUPS)
    doc["appliers"] = _appliers()
    doc["consumers"] = _consumers()
    if census:
        counts = Counter(type(o).__qualname__ for o in gc.get_objects())
        doc["census"] = dict(counts.most_common(25))
        if tracemalloc.is_tracing():
            doc["traced"] = traced_top(tracemalloc.take_snapshot())
    doc["probe_cpu_s"] = round(time.process_time() - t0, 3)
    return doc


def traced_top(snapshot: Any, limit: int = 30) -> list[dict[str, Any]]:
    """The allocation sites holding the most traced bytes: where the Python heap of a sample is."""
    stats = snapshot.statistics("traceback")
    return [
        {
            "mib": round(st.size / MIB, 1),
            "blocks": st.count,
            "where": [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in st.traceback],
        }
        for st in stats[:limit]
    ]


def _stacks(limit: int = 12) -> dict[str, list[str]]:
    """Each other thread's innermost ``limit`` frames, as ``file:line function`` (innermost first)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = {}
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        lines: list[str] = []
        f: Any = frame
        while f is not None and len(lines) < limit:
            code = f.f_code
            lines.append(f"{'/'.join(code.co_filename.rsplit('/', 2)[-2:])}:{f.f_lineno} {code.co_name}")
            f = f.f_back
        out[names.get(ident, str(ident))] = lines
    return out


def watch_peaks(path: str, every: float = 0.01, step: int = 16 * MIB) -> None:
    """Append the threads' stacks to ``path`` each time Arrow's live bytes pass a new high by ``step``:
    where the allocation peaks that an allocator may keep afterwards are made."""
    import pyarrow as pa

    high = 0

    def loop() -> None:
        nonlocal high
        while True:
            time.sleep(every)
            now = pa.total_allocated_bytes()
            if now >= high + step:
                high = now
                with open(path, "a") as f:
                    f.write(json.dumps({"t": round(time.time(), 2), "arrow": now, "stacks": _stacks()}) + "\n")

    threading.Thread(target=loop, name="memory probe peaks", daemon=True).start()


def install(
    path: str, interval: float = 30.0, census_every: int = 4, release_every: int = 0, trace_frames: int = 0
) -> None:
    """Register the holders' classes and append a sample to ``path`` every ``interval`` seconds.

    ``trace_frames`` > 0 also traces Python allocations (``tracemalloc``, that many frames each; slows
    the worker severalfold) and adds the largest allocation sites to each census sample."""
    if trace_frames > 0:
        tracemalloc.start(trace_frames)
    from aiokafka import AIOKafkaConsumer

    from agents.applier import Applier
    from sinks.rowdelta import FileCache
    from streams.memory import NativeBudget

    _register(FileCache, "file_cache")
    _register(NativeBudget, "native_budget")
    _register(Applier, "applier")
    _register(AIOKafkaConsumer, "consumer")
    _count_log_lookups()
    started = time.time()
    lock = threading.Lock()

    def write(census: bool, released: bool = False) -> None:
        with lock:
            doc = sample(census)
            if released:
                doc["release"] = release()
            doc["elapsed_s"] = round(doc["t"] - started, 1)
            with open(path, "a") as f:
                f.write(json.dumps(doc) + "\n")

    def loop() -> None:
        n = 0
        while True:
            time.sleep(interval)
            n += 1
            try:
                write(
                    census=census_every > 0 and n % census_every == 0,
                    released=release_every > 0 and n % release_every == 0,
                )
            except Exception as exc:  # noqa: BLE001 - a failed sample must not stop the worker
                print(f"memory probe: {exc!r}", file=sys.stderr)

    threading.Thread(target=loop, name="memory probe", daemon=True).start()
    watch_peaks(path + ".peaks")
    atexit.register(lambda: write(census=False, released=True))
    print(f"memory probe installed, writing {path} every {interval:.0f}s", file=sys.stderr)


# --- report --------------------------------------------------------------------------------------


def rows(samples: list[dict[str, Any]]) -> list[dict[str, float]]:
    """One row per sample, in MiB: RSS and what each holder accounts for."""
    out = []
    for s in samples:
        fc = s["file_caches"]
        ap = s["appliers"]
        out.append(
            {
                "min": round(s["elapsed_s"] / 60, 1),
                "rss": s["VmRSS"] / MIB,
                "anon": s.get("RssAnon", 0) / MIB,
                "arrow": s["arrow_total"] / MIB,
                "index": sum(c["index_buffers"] for c in fc) / MIB,
                "index_files": sum(c["index_files"] for c in fc),
                "rows": sum(c["rows_buffers"] for c in fc) / MIB,
                "rows_files": sum(c["rows_files"] for c in fc),
                "split_files": sum(c["split_files"] for c in fc),
                "filter_files": sum(c.get("filter_files", 0) for c in fc),
                "mimalloc": (s.get("mimalloc_committed") or 0) / MIB,
                "mi_pages": s.get("mimalloc_pages", 0),
                "mi_abandoned": s.get("mimalloc_abandoned", 0),
                "malloc": ((s.get("malloc_system") or 0) + (s.get("malloc_mmap") or 0) or s.get("malloc_in_use", 0))
                / MIB,
                "malloc_free": (s.get("malloc_all_free") or s.get("malloc_free", 0)) / MIB,
                "pymalloc": (s["pymalloc_arenas"] or 0) / MIB,
                "blocks_k": s["pymalloc_blocks"] / 1000,
                "m_entries": s["manifests"]["manifest_entries"],
                "lists": s["manifests"]["lists_cached"],
                "list_manifests": s["manifests"]["list_manifests"],
                "gate_applied": sum(a["gate_applied"] for a in ap),
                "held": sum(a["held_records"] for a in ap),
                "held_mb": sum(a["held_record_bytes"] for a in ap) / MIB,
                "batched": sum(a["batched"] for a in ap),
                "parked": sum(a["gate_parked"] for a in ap),
                "paused": sum(c.get("paused", 0) for c in s.get("consumers", [])),
                "fetched_mb": sum(c.get("fetched_bytes", 0) for c in s.get("consumers", [])) / MIB,
                "filters_mb": sum(c.get("filter_bytes", 0) for c in fc) / MIB,
                "log_filters_mb": sum(c.get("filter_bytes_by_column", {}).get("event_id", 0) for c in fc) / MIB,
                "spill_mb": sum(c.get("spill_bytes", 0) for c in fc) / MIB,
                "spill_reads": sum(c.get("spill_reads", 0) for c in fc),
                "log_lookups": s.get("log_lookups", {}).get("calls", 0),
                "log_lookup_s": round(s.get("log_lookups", {}).get("seconds", 0.0), 1),
                "arrow_peak": s.get("arrow_default_pool_peak", 0) / MIB,
                "je_resident": s.get("jemalloc_resident", 0) / MIB,
                "je_active": s.get("jemalloc_active", 0) / MIB,
                "heap": s.get("smaps_heap", 0) / MIB,
                "anon_64m": s.get("smaps_anon_64m", 0) / MIB,
                "anon_reserved": s.get("smaps_anon_reserved", 0) / MIB,
                "mi_live": s.get("mimalloc_live", 0) / MIB,
                "anon_other": s.get("smaps_anon_other", 0) / MIB,
                "threads": s.get("os_threads", 0),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples", type=Path, help="the JSON-lines file the probe wrote")
    args = parser.parse_args(argv)
    samples = [json.loads(line) for line in args.samples.read_text().splitlines() if line.strip()]
    table = rows(samples)
    if not table:
        print("no samples")
        return 1
    cols = list(table[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + " --- |" * len(cols))
    for r in table:
        print(
            "| "
            + " | ".join(f"{v:.0f}" if isinstance(v, float) and k != "min" else str(v) for k, v in r.items())
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
