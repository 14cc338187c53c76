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
"""

from __future__ import annotations

import os
import threading
from typing import Any

from pyiceberg.io import FileIO, InputFile, OutputFile, load_file_io
from pyiceberg.typedef import Properties

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


def open_output(io: FileIO, location: str) -> Any:
    """A writable stream for ``location`` (overwriting), one filesystem open in the common case.

    A missing parent directory (a local warehouse's new partition directory) is created when the
    open reports it, then the open is retried; object stores have none to create. FileIOs other
    than pyiceberg's PyArrowFileIO go through their own ``new_output(...).create``.
    """
    from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFileIO

    if not isinstance(io, PyArrowFileIO):
        return io.new_output(location).create(overwrite=True)
    scheme, netloc, path = io.parse_location(location, io.properties)
    fs = io.fs_by_scheme(scheme, netloc)
    buffer_size = int(io.properties.get(BUFFER_SIZE, ONE_MEGABYTE))
    try:
        return _open(fs, path, buffer_size)
    except FileNotFoundError:
        fs.create_dir(os.path.dirname(path), recursive=True)
        return _open(fs, path, buffer_size)


def _open(fs: Any, path: str, buffer_size: int) -> Any:
    from pyarrow.fs import LocalFileSystem
    from pyiceberg.io.pyarrow import PyArrowLocalFileSystem

    if isinstance(fs, PyArrowLocalFileSystem):
        # pyiceberg's subclass runs a recursive create_dir of the parent before every open; the
        # base class only opens (a missing parent raises FileNotFoundError, handled above).
        return LocalFileSystem.open_output_stream(fs, path, buffer_size=buffer_size)
    return fs.open_output_stream(path, buffer_size=buffer_size)


class SizedOutputFile(OutputFile):
    """pyiceberg's ``OutputFile`` for files written once through :func:`open_output`, whose length
    is the size its stream had when it was closed (pyiceberg's ``len()`` stats the file: a
    manifest's length is asked once it is written, for its entry in the manifest list)."""

    def __init__(self, io: FileIO, location: str) -> None:
        super().__init__(location)
        self._io = io
        self._size: int | None = None

    def create(self, overwrite: bool = False) -> Any:
        # Manifest and manifest-list names carry a fresh UUID: nothing to overwrite, no check.
        return _SizedStream(open_output(self._io, self.location), self)

    def __len__(self) -> int:
        return self._size if self._size is not None else len(self._io.new_input(self.location))

    def exists(self) -> bool:
        return self._size is not None or self._io.new_input(self.location).exists()

    def to_input_file(self) -> InputFile:
        return self._io.new_input(self.location)


class _SizedStream:
    """An output stream that tells its file its size when closed."""

    def __init__(self, stream: Any, file: SizedOutputFile) -> None:
        self._stream = stream
        self._file = file
        self.write = stream.write  # bound once: Avro encoders write many small pieces

    def tell(self) -> int:
        return int(self._stream.tell())

    def close(self) -> None:
        if not self._stream.closed:
            self._file._size = self._stream.tell()
            self._stream.close()

    def __enter__(self) -> _SizedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
