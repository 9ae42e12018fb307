"""Atomic, durable replacement of a small file: the one way segue rewrites a config file.

The bytes go to a temporary file in the same directory, which is fsynced and
renamed over the target; then the directory is fsynced so the rename survives
a power cut. A reader sees the old file or the new one, never a torn one.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """A rename or a new entry is durable only once its directory is fsynced; without
    this a crash can forget the entry even though the file's data is on disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # a libc without it
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def start_writeback(fd: int, offset: int = 0, nbytes: int = 0) -> None:
    """Have the kernel start writing ``fd``'s dirty pages to the device now, without
    waiting for them (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``): the pages of
    ``nbytes`` from ``offset``, or, with ``nbytes`` 0, every page from ``offset`` on.

    Durability still takes an ``fsync``, which also reports any write error; this
    only lets the device work while the caller goes on writing. It does nothing
    where the call does not exist.
    """
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # advisory: the fsync reports errors


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``; the file gets ``mode`` (0o600 for secrets) from its creation."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)
