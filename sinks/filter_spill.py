"""Key filters the file cache had to evict, kept on the worker's local disk and read back whole.

A data file's key filter (:mod:`sinks.keyfilter`) is immutable like the file. Held only in memory, an
evicted filter was rebuilt by reading the file's key column and hashing every key (~0.6 us a key:
~60 ms for a 100k-row log file), and once the filters every lookup probes outgrew their budget each
lookup evicted what the next one needed: in a 30-minute soak at 5,000/s, 62 % of the worker's time
(docs/benchmarks.md, "2026-12-02 small hours: the 30-minute soak at 5,000/s"). Here an evicted
filter is written once to a file of its own and read back with one plain read (~5-10 bytes a key),
so a miss costs a small local read, never a column read and a build.

Why local and not beside the data files in the warehouse: nothing in the warehouse's lifecycle
(orphan clean-up, compaction's expiry, ``world`` deletes, S3) has to know about it, and a miss
never becomes an S3 request. The store is the worker's own: one directory per cache under
``<root>/<pid>-<token>``, removed when the cache goes (or the process exits); a directory left by a
process that no longer runs (a ``kill -9``) is removed by the next store made under the same root.
It is bounded in bytes, least recently used files removed first; a filter removed from it is simply
absent again (then rebuilt from the file, as before). Reads are plain ``read`` calls into a buffer
the filter owns, not ``mmap``: a mapping would pin the pages in the worker's RSS.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from pathlib import Path

from sinks.keyfilter import KeyFilter

#: A filter's key: (data file path, key column).
Key = tuple[str, str]


class FilterSpill:
    """Key filters on local disk, by (data file path, key column), bounded by ``max_bytes``; thread-safe."""

    def __init__(self, root: str | Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._dir: Path | None = None  # made on the first write: a cache that never spills makes none
        self._files: OrderedDict[Key, int] = OrderedDict()  # key -> bytes on disk, least recently used first
        self._bytes = 0
        self._lock = threading.Lock()
        #: Counts for the benches and tests: filters written, read back, and found missing.
        self.writes = 0
        self.reads = 0

    def __contains__(self, key: Key) -> bool:
        with self._lock:
            return key in self._files

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, key: Key, kf: KeyFilter) -> None:
        """Keep ``kf`` for ``key`` unless it is kept already or larger than the bound."""
        size = kf.nbytes
        if not self.max_bytes or size > self.max_bytes or key in self:
            return
        folder = self._folder()
        name = folder / _name(key)
        tmp = name.with_suffix(f".{threading.get_ident()}.tmp")
        # Written whole, then renamed: a reader never sees a part of a filter (a torn file would
        # be a filter with missing bits, i.e. false negatives).
        with open(tmp, "wb") as f:
            f.write(kf.to_bytes())
        os.replace(tmp, name)
        gone: list[Key] = []
        with self._lock:
            self.writes += 1
            if key in self._files:
                return
            self._files[key] = size
            self._bytes += size
            while self._bytes > self.max_bytes:
                old, old_size = self._files.popitem(last=False)
                self._bytes -= old_size
                gone.append(old)
        self._unlink(gone)

    def get(self, key: Key) -> KeyFilter | None:
        """The filter kept for ``key``, read from disk; None when none is kept."""
        with self._lock:
            if key not in self._files or self._dir is None:
                return None
            self._files.move_to_end(key)
            name = self._dir / _name(key)
        try:
            with open(name, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # removed by a concurrent put's eviction or a forget
            return None
        self.reads += 1
        return KeyFilter.from_bytes(data)

    def drop(self, keys: list[Key]) -> None:
        """Forget the filters of ``keys`` (data files a commit removed)."""
        gone: list[Key] = []
        with self._lock:
            for key in keys:
                size = self._files.pop(key, None)
                if size is not None:
                    self._bytes -= size
                    gone.append(key)
        self._unlink(gone)

    def _unlink(self, keys: list[Key]) -> None:
        if self._dir is None:
            return
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._dir / _name(key))

    def _folder(self) -> Path:
        with self._lock:
            if self._dir is None:
                self.root.mkdir(parents=True, exist_ok=True)
                _remove_dead(self.root)
                self._dir = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=self.root))
                weakref.finalize(self, shutil.rmtree, self._dir, True)
            return self._dir


def _name(key: Key) -> str:
    path, column = key
    return hashlib.sha1(f"{column}\0{path}".encode(), usedforsecurity=False).hexdigest() + ".kf"


def _remove_dead(root: Path) -> None:
    """Remove the stores of processes that no longer run (``<pid>-<token>``); a live one is kept."""
    for entry in root.iterdir():
        pid, sep, _ = entry.name.partition("-")
        if not sep or not pid.isdigit() or not entry.is_dir() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:
            pass  # a live process of another user
