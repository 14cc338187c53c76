"""FileIO for the warehouse, paid once per configuration and not per file.

pyiceberg's ``load_file_io`` builds a new ``PyArrowFileIO`` on every call, and each FileIO builds its
own pyarrow filesystem on first use (an ``S3FileSystem`` with its client for ``s3://``): a commit
loaded ~17 FileIOs and built ~7 filesystems. :func:`file_io` keeps one per (properties, scheme).

Writing a file through ``io.new_output(path).create()`` parses the URI, wraps it, and on a local
warehouse runs a recursive ``create_dir`` of the parent before every open; ``len(output)`` then
stats the file just written for its size. :func:`open_output` opens the stream on the FileIO's own
filesystem directly (the same path, buffer size and filesystem pyiceberg would use), creating the
parent directory only when the open finds it missing; callers take the size from ``tell()``
before closing.

A small file (a small flush's Parquet file, a manifest, a manifest list, a metadata JSON) is built
in memory and handed to :func:`write_file`: one open, one write, one close. The stream
:func:`open_output` gives holds a 1 MiB buffer (pyiceberg's ``io.buffer-size`` default) that is
allocated and released for every file, and on a local warehouse pyarrow's stream adds its own
object layers; an ``os.open``/``os.write`` of the finished bytes is ~60-110 µs of CPU less a file
(docs/benchmarks.md, "2026-12-02 small hours: the fixed CPU of a file").
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pyiceberg.io import FileIO, InputFile, OutputFile, load_file_io
from pyiceberg.typedef import Properties

T = TypeVar("T")

_IOS: dict[tuple[Any, ...], FileIO] = {}
_IOS_MAX = 64
_LOCK = threading.Lock()


#: Table properties causeway keeps its own state in (the committed-offset map, truncated types,
#: schema contracts). No FileIO reads them, and the offset map changes with every commit: keyed by
#: it, every commit built a FileIO and, on first use, its filesystem.
_STATE_PREFIX = "causeway."


def file_io(properties: Properties, location: str | None) -> FileIO:
    """pyiceberg's ``load_file_io(properties, location)``, one instance per properties and scheme.

    A FileIO holds no per-file state (PyArrowFileIO: its filesystems, built once each), so tables
    with the same properties share it. causeway's own table properties are left out (of the key and
    of the FileIO's properties): they configure no I/O.
    """
    scheme = location.split("://", 1)[0] if location and "://" in location else None
    io_properties = {k: v for k, v in properties.items() if not k.startswith(_STATE_PREFIX)}
    key = (tuple(sorted(io_properties.items())), scheme)
    with _LOCK:
        found = _IOS.get(key)
    if found is not None:
        return found
    io = load_file_io(io_properties, location)
    with _LOCK:
        if len(_IOS) >= _IOS_MAX:
            _IOS.clear()
        return _IOS.setdefault(key, io)


#: ``PyArrowFileIO.parse_location`` of a directory, by its location: every file a commit writes
#: (~15) is parsed for its filesystem path, and most go to a few directories per table.
_DIRS: dict[str, tuple[str, str, str]] = {}
_DIRS_MAX = 4096
#: Characters that make ``urlparse`` read a location other than as directory + name (a query, a
#: fragment, a last segment's parameters, the whitespace it strips).
_NOT_PLAIN = frozenset("?#;\t\r\n\\")
#: A URI scheme (RFC 3986). ``/tmp/a://b`` holds ``://`` but is a local path: pyiceberg resolves it
#: against the working directory and the properties' default scheme, which a kept parse would not.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def parse_location(location: str, properties: Any) -> tuple[str, str, str]:
    """``PyArrowFileIO.parse_location(location, properties)``: (scheme, netloc, filesystem path).

    pyiceberg's parses the whole URI every time (~11 µs); a location with a scheme is its
    directory's parse with the name appended, so the directory is parsed once. Locations without
    a scheme (made absolute against the working directory) and any with a character ``urlparse``
    treats specially go to pyiceberg's.
    """
    from pyiceberg.io.pyarrow import PyArrowFileIO

    directory, _, name = location.rpartition("/")
    scheme, sep, _ = directory.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme) or name in ("", ".", "..") or not _NOT_PLAIN.isdisjoint(location):
        return PyArrowFileIO.parse_location(location, properties)
    parsed = _DIRS.get(directory)
    if parsed is None:
        parsed = PyArrowFileIO.parse_location(directory, properties)
        with _LOCK:
            if len(_DIRS) >= _DIRS_MAX:
                _DIRS.clear()
            _DIRS[directory] = parsed
    scheme, netloc, path = parsed
    return scheme, netloc, f"{path}/{name}"


def open_output(io: FileIO, location: str) -> Any:
    """A writable stream for ``location`` (overwriting), one filesystem open in the common case.

    A missing parent directory (a local warehouse's new partition directory) is created when the
    open reports it, then the open is retried; object stores have none to create. FileIOs other
    than pyiceberg's PyArrowFileIO go through their own ``new_output(...).create``.
    """
    from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFileIO

    if not isinstance(io, PyArrowFileIO):
        return io.new_output(location).create(overwrite=True)
    scheme, netloc, path = parse_location(location, io.properties)
    fs = io.fs_by_scheme(scheme, netloc)
    buffer_size = int(io.properties.get(BUFFER_SIZE, ONE_MEGABYTE))
    return _creating_parent(fs, path, lambda: _open(fs, path, buffer_size))


def write_file(io: FileIO, location: str, data: Any) -> int:
    """Create (or overwrite) ``location`` holding ``data`` (bytes or any buffer) in one write; its size.

    On a local warehouse the file is written with ``os.open``/``os.write`` (what pyarrow's local
    stream does, without its buffer and objects); elsewhere through an unbuffered stream of the
    FileIO's filesystem (an object store uploads on close either way). A missing parent directory
    is created when the open reports it, as :func:`open_output` does.
    """
    from pyarrow.fs import LocalFileSystem
    from pyiceberg.io.pyarrow import PyArrowFileIO

    view = memoryview(data).cast("B")
    if not isinstance(io, PyArrowFileIO):
        with io.new_output(location).create(overwrite=True) as out:
            out.write(view.tobytes())  # pyiceberg's OutputStream takes bytes
        return len(view)
    scheme, netloc, path = parse_location(location, io.properties)
    fs = io.fs_by_scheme(scheme, netloc)
    if isinstance(fs, LocalFileSystem):
        fd = _creating_parent(fs, path, lambda: os.open(path, _CREATE, 0o666))
        try:
            done = 0
            while done < len(view):  # os.write may write less than asked (a signal, a large file)
                done += os.write(fd, view[done:])
        finally:
            os.close(fd)
        return len(view)
    with _creating_parent(fs, path, lambda: _open(fs, path, 0)) as out:
        out.write(view)
    return len(view)


def _creating_parent(fs: Any, path: str, open_: Callable[[], T]) -> T:
    """``open_()``, and once more after creating the parent directory when it is missing (a local
    warehouse's new partition directory; object stores have none to create)."""
    try:
        return open_()
    except FileNotFoundError:
        fs.create_dir(os.path.dirname(path), recursive=True)
        return open_()


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)


def _open(fs: Any, path: str, buffer_size: int) -> Any:
    from pyarrow.fs import LocalFileSystem
    from pyiceberg.io.pyarrow import PyArrowLocalFileSystem

    if isinstance(fs, PyArrowLocalFileSystem):
        # pyiceberg's subclass runs a recursive create_dir of the parent before every open; the
        # base class only opens (a missing parent raises FileNotFoundError, handled above).
        return LocalFileSystem.open_output_stream(fs, path, buffer_size=buffer_size)
    return fs.open_output_stream(path, buffer_size=buffer_size)


class SizedOutputFile(OutputFile):
    """pyiceberg's ``OutputFile`` for small files written once (manifests, manifest lists): the
    bytes are gathered in memory and written by :func:`write_file` when the stream is closed, and
    the file's length is theirs (pyiceberg's ``len()`` stats the file: a manifest's length is asked
    once it is written, for its entry in the manifest list)."""

    def __init__(self, io: FileIO, location: str) -> None:
        super().__init__(location)
        self._io = io
        self._size: int | None = None

    def create(self, overwrite: bool = False) -> Any:
        # Manifest and manifest-list names carry a fresh UUID: nothing to overwrite, no check.
        return _SizedStream(self)

    def __len__(self) -> int:
        return self._size if self._size is not None else len(self._io.new_input(self.location))

    def exists(self) -> bool:
        return self._size is not None or self._io.new_input(self.location).exists()

    def to_input_file(self) -> InputFile:
        return self._io.new_input(self.location)


class _SizedStream:
    """An output stream into memory that writes its file, and tells it its size, when closed."""

    def __init__(self, file: SizedOutputFile) -> None:
        self._buffer = bytearray()
        self._file = file
        self.closed = False
        self.write = self._buffer.extend  # bound once: Avro encoders write many small pieces

    def tell(self) -> int:
        return len(self._buffer)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._file._size = write_file(self._file._io, self._file.location, self._buffer)

    def __enter__(self) -> _SizedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
