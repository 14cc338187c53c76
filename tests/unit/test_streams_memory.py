"""streams/memory.py: the worker's allocator settings reach the process, and release hands memory back."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from streams import memory
from streams.settings import ARROW_POOL_ENV, JEMALLOC_CONF_DEFAULT, JEMALLOC_CONF_ENV, Settings, SettingsError


@pytest.fixture
def restore_pool() -> Iterator[None]:
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)


def test_the_settings_pool_becomes_arrows_default(restore_pool: None) -> None:
    settings = Settings.from_env({"CAUSEWAY_MEMORY_POOL": "system", "CAUSEWAY_MALLOC_ARENA_MAX": "2"})
    applied = memory.configure(settings.memory_pool, settings.malloc_arena_max)
    assert (applied.pool, applied.arena_max) == ("system", 2)
    assert pa.default_memory_pool().backend_name == "system"
    held = pa.array(range(100_000), pa.int64())  # allocations now go through it
    assert pa.system_memory_pool().bytes_allocated() >= held.nbytes


def test_an_unknown_pool_is_refused(restore_pool: None) -> None:
    with pytest.raises(SettingsError, match="tcmalloc"):
        memory.configure("tcmalloc", 0)


def test_release_returns_freed_glibc_memory_to_the_os(restore_pool: None) -> None:
    # Many small blocks freed in the middle of the heap: free() keeps them, malloc_trim hands the
    # whole pages back (the part of a freed transient a worker would otherwise keep).
    memory.configure("system", 0)
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    keep = libc.malloc(64)  # pins the heap's top so that only a trim of inner pages gives memory back
    blocks = [libc.malloc(4096) for _ in range(20_000)]
    top = libc.malloc(64)
    for b in blocks:
        libc.free(b)
    before = _rss()
    memory.release()
    assert before - _rss() > 40 << 20  # ~80 MiB were freed; most of it goes back
    libc.free(keep)
    libc.free(top)


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_the_releaser_releases_until_stopped() -> None:
    releaser = memory.Releaser(0.01)
    releaser.start()
    for _ in range(500):
        if releaser.releases >= 2:
            break
        time.sleep(0.01)
    releaser.stop()
    assert releaser.releases >= 2
    off = memory.Releaser(0)
    off.start()
    time.sleep(0.05)
    assert off.releases == 0 and off._thread is None  # noqa: SLF001 - 0 means no thread at all


def test_by_default_the_worker_uses_jemalloc_and_releases_what_it_holds_free(restore_pool: None) -> None:
    # The 30-minute soak at 5,000/s (docs/benchmarks.md, 2026-12-03 small hours): jemalloc with its
    # muzzy pages purged at once grew 1.33x where mimalloc grew 1.40x, with the same CPU a phase; the
    # system pool cost 11-23 % more CPU per commit (2026-12-01 evening).
    settings = Settings.from_env({})
    assert settings.memory_pool == "jemalloc" and settings.malloc_arena_max == 0
    applied = memory.configure(settings.memory_pool, settings.malloc_arena_max)
    assert applied.pool == "jemalloc" == pa.default_memory_pool().backend_name
    assert settings.memory_release_interval_s > 0


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in os.environ.items() if k not in (JEMALLOC_CONF_ENV, ARROW_POOL_ENV, "CAUSEWAY_MEMORY_POOL")
    }
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def test_every_causeway_process_gives_jemalloc_its_options_before_pyarrow_loads() -> None:
    # jemalloc reads JE_ARROW_MALLOC_CONF once, when libarrow loads: set after `import pyarrow` it
    # is ignored, so the `cli` package (first in every `causeway` process) sets it before.
    seen = _python(
        "import os, sys; import cli; print('pyarrow' in sys.modules, os.environ.get('JE_ARROW_MALLOC_CONF'))", {}
    )
    assert seen.stdout.split() == ["False", JEMALLOC_CONF_DEFAULT], seen.stderr


def test_an_operators_own_jemalloc_options_are_kept_and_reach_jemalloc() -> None:
    # An invalid option with abort_conf makes jemalloc abort at its first allocation: proof that the
    # value the process starts with is the one jemalloc reads, through `cli` as the worker starts.
    code = "import cli, os; from streams import memory; memory.configure('jemalloc', 0); import pyarrow as pa; "
    code += "pa.array(range(1000)); print(os.environ['JE_ARROW_MALLOC_CONF'])"
    kept = _python(code, {JEMALLOC_CONF_ENV: "abort_conf:true,muzzy_decay_ms:0"})
    assert kept.returncode == 0 and kept.stdout.strip() == "abort_conf:true,muzzy_decay_ms:0", kept.stderr
    refused = _python(code, {JEMALLOC_CONF_ENV: "abort_conf:true,no_such_option:1"})
    assert refused.returncode != 0 and "no_such_option" in refused.stderr


def test_releases_look_the_c_library_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # ctypes.util.find_library runs `ldconfig -p` in a subprocess: a release every 30 s paid it
    # every time (failed before: one lookup per release).
    import ctypes.util

    memory._libc.cache_clear()  # noqa: SLF001 - a fresh process's first lookup
    looked: list[str] = []
    real = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: looked.append(name) or real(name))
    for _ in range(3):
        memory.release()
    assert looked == ["c"]


def test_a_job_is_admitted_when_it_fits_or_runs_alone() -> None:
    assert memory.admits(0, 10, 100)
    assert memory.admits(60, 40, 100)
    assert not memory.admits(61, 40, 100)
    assert memory.admits(0, 500, 100)  # larger than the budget: alone, never refused
    assert not memory.admits(1, 500, 100)


def test_the_native_budget_makes_a_job_wait_until_the_others_fit() -> None:
    import threading

    budget = memory.NativeBudget(100)
    started, finish = threading.Event(), threading.Event()
    order: list[str] = []

    def second() -> None:
        with budget.hold(50):
            order.append("second")
            started.set()
            finish.wait(5)

    with budget.hold(70):
        waiter = threading.Thread(target=second)
        waiter.start()
        assert not started.wait(0.2)  # 70 + 50 > 100: the second job waits
        order.append("first done")
    assert started.wait(5)
    assert order == ["first done", "second"]
    assert budget.waits == 1 and budget.peak == 70 and budget.in_use == 50
    finish.set()
    waiter.join()
    assert budget.in_use == 0


def test_jobs_that_fit_run_together_and_no_bound_never_waits() -> None:
    budget = memory.NativeBudget(100)
    with budget.hold(40), budget.hold(60):
        assert budget.in_use == 100
    assert budget.in_use == 0 and budget.waits == 0 and budget.peak == 100
    free = memory.NativeBudget(0)
    with free.hold(10**12), free.hold(10**12):
        assert free.in_use == 0 and free.waits == 0
    with pytest.raises(ValueError, match="negative"):
        memory.NativeBudget(-1)


_PARQUET_ROUND_TRIP = (
    "import cli, io; from streams import memory; from streams.settings import Settings; "
    "s = Settings.from_env(); a = memory.configure(s.memory_pool, 0); "
    "import pyarrow as pa, pyarrow.parquet as pq; "
    "t = pa.table({'k': [str(i) for i in range(200000)]}); buf = io.BytesIO(); pq.write_table(t, buf); "
    "pq.read_table(io.BytesIO(buf.getvalue())); "
    "mi, je = pa.mimalloc_memory_pool(), pa.jemalloc_memory_pool(); "
    "print(a.pool, a.native, mi.max_memory() > 0, je.max_memory() > 0)"
)


def test_arrows_cpp_code_allocates_from_the_pool_its_setting_names() -> None:
    # `pa.set_memory_pool` only changes the pool of pyarrow's own calls; the Parquet writer and
    # reader take libarrow's default, chosen from ARROW_DEFAULT_MEMORY_POOL when it loads. Failed
    # before: no setting reached it, and the Parquet files always went through mimalloc.
    seen = _python(_PARQUET_ROUND_TRIP, {"CAUSEWAY_ARROW_CPP_POOL": "jemalloc"})
    assert seen.stdout.split() == ["jemalloc", "jemalloc", "False", "True"], seen.stderr
    system = _python(_PARQUET_ROUND_TRIP, {"CAUSEWAY_ARROW_CPP_POOL": "system", "CAUSEWAY_MEMORY_POOL": "system"})
    assert system.stdout.split() == ["system", "system", "False", "False"], system.stderr


def test_by_default_arrows_cpp_code_keeps_pyarrows_choice_and_an_operators_own_value_is_kept() -> None:
    # The default is pyarrow's choice (mimalloc): with jemalloc the full profile read 7.4-7.9k
    # against 11.7-12.5k events/s in two alternated pairs (docs/benchmarks.md, 2026-12-03 noon).
    default = _python(_PARQUET_ROUND_TRIP, {})
    assert default.stdout.split() == ["jemalloc", "mimalloc", "True", "True"], default.stderr
    left = _python("import cli, os; print(os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))", {})
    assert left.stdout.strip() == "None", left.stderr
    own = _python(_PARQUET_ROUND_TRIP, {"ARROW_DEFAULT_MEMORY_POOL": "system", "CAUSEWAY_ARROW_CPP_POOL": "jemalloc"})
    assert own.stdout.split()[:2] == ["jemalloc", "system"], own.stderr


def test_an_unknown_cpp_pool_is_refused_with_its_variable_named() -> None:
    with pytest.raises(SettingsError, match="CAUSEWAY_ARROW_CPP_POOL"):
        Settings.from_env({"CAUSEWAY_ARROW_CPP_POOL": "tcmalloc"})
