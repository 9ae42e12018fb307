"""Atomic, durable replacement of a small file: the one way segue rewrites a config file.

The bytes go to a temporary file in the same directory, which is fsynced and
renamed over the target; then the directory is fsynced so the rename survives
a power cut. A reader sees the old file or the new one, never a torn one.
"""

from __future__ import annotations

import os


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """A rename or a new entry is durable only once its directory is fsynced; without
    this a crash can forget the entry even though the file's data is on disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
