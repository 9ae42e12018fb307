"""Where checkpoint bytes live: the storage interface and its local-directory backend.

:class:`CheckpointStorage` is the seam the checkpoint format is written against, so
an fsspec/S3 backend can follow. Paths are relative POSIX paths under the storage
root; a backend must never read or write outside its root.

:class:`LocalStorage` makes every write atomic and durable: bytes go to a temp name
in the same directory, are fsynced, ``os.replace``d into place, and the directory is
fsynced. A reader therefore sees either the old file, or the whole new one, never a
torn one, even after power loss.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

TEMP_MARK = ".tmp-"
"""Temp files are named ``.<name>.tmp-<pid>-<random>``; nothing ever reads them."""


def check_relpath(relpath: str) -> PurePosixPath:
    """Parse a storage path; reject anything that could escape the storage root."""
    if not isinstance(relpath, str):
        raise TypeError(f"storage paths are str, not {type(relpath).__name__}")
    p = PurePosixPath(relpath)
    if p.is_absolute() or relpath.startswith("\\") or (len(relpath) > 1 and relpath[1] == ":"):
        raise ValueError(
            f"storage path {relpath!r} is absolute; pass a path relative to the storage root"
        )
    if ".." in p.parts or "\\" in relpath:
        raise ValueError(
            f"storage path {relpath!r} leaves the storage root; "
            "pass a relative path without '..' or backslashes"
        )
    return p


class CheckpointStorage(ABC):
    """Byte storage for checkpoints, addressed by relative POSIX paths."""

    @abstractmethod
    def open_write(
        self, relpath: str, *, before_publish: Callable[[], None] | None = None
    ) -> AbstractContextManager[BinaryIO]:
        """A writable file that appears at ``relpath`` atomically and durably on exit.

        On an exception nothing appears. ``before_publish`` runs once the bytes are
        durable but not yet visible (a seam for fault injection).
        """

    def write_bytes_atomic(
        self, relpath: str, data: bytes, *, before_publish: Callable[[], None] | None = None
    ) -> None:
        with self.open_write(relpath, before_publish=before_publish) as f:
            f.write(data)

    @abstractmethod
    def open_read(self, relpath: str) -> BinaryIO: ...

    def read_bytes(self, relpath: str) -> bytes:
        with self.open_read(relpath) as f:
            return f.read()

    @abstractmethod
    def size(self, relpath: str) -> int: ...

    @abstractmethod
    def exists(self, relpath: str) -> bool: ...

    @abstractmethod
    def listdir(self, reldir: str) -> list[str]:
        """Sorted entry names under ``reldir``; empty if it does not exist.

        Object stores have no directories, so "missing" and "empty" are the same there;
        every backend answers the same way.
        """

    @abstractmethod
    def move(self, src: str, dst: str) -> None:
        """Durably move a file or directory; ``dst`` must not exist."""

    @abstractmethod
    def remove_tree(self, reldir: str) -> None:
        """Remove a directory and everything under it (missing is not an error)."""

    def local_path(self, relpath: str) -> Path | None:
        """A local filesystem path for ``relpath``, or None for remote backends."""
        return None


def _fsync_dir(path: Path) -> None:
    # A rename or a new entry is only durable once the directory itself is fsynced;
    # without this a crash can forget the entry even though the file data is on disk.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStorage(CheckpointStorage):
    """Checkpoint storage in a local directory, with atomic and durable writes."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    def _abs(self, relpath: str) -> Path:
        return self.root.joinpath(*check_relpath(relpath).parts)

    def _makedirs(self, path: Path) -> None:
        missing: list[Path] = []
        while not path.exists():
            missing.append(path)
            path = path.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):  # a concurrent writer made it
                d.mkdir()
            # The new directory's entry lives in its parent: fsync the parent so a
            # crash cannot drop the directory that holds files we are about to publish.
            _fsync_dir(d.parent)

    @contextlib.contextmanager
    def open_write(
        self, relpath: str, *, before_publish: Callable[[], None] | None = None
    ) -> Iterator[BinaryIO]:
        final = self._abs(relpath)
        if final == self.root:
            raise ValueError("storage path '' names the root; pass a file path")
        self._makedirs(final.parent)
        # Same directory as the final name, so os.replace is a rename within one
        # filesystem, which POSIX makes atomic.
        tmp = final.with_name(f".{final.name}{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        f = open(tmp, "xb")  # closed below on every path
        try:
            yield f
            f.flush()
            # The data must be on disk before the rename makes it visible; otherwise a
            # crash could publish a name that points at missing or zeroed blocks.
            os.fsync(f.fileno())
            f.close()
            if before_publish is not None:
                before_publish()
            os.replace(tmp, final)
        except BaseException:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        # Make the rename itself durable.
        _fsync_dir(final.parent)

    def open_read(self, relpath: str) -> BinaryIO:
        return open(self._abs(relpath), "rb")

    def size(self, relpath: str) -> int:
        return self._abs(relpath).stat().st_size

    def exists(self, relpath: str) -> bool:
        return self._abs(relpath).exists()

    def listdir(self, reldir: str) -> list[str]:
        try:
            return sorted(os.listdir(self._abs(reldir)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def move(self, src: str, dst: str) -> None:
        s, d = self._abs(src), self._abs(dst)
        if s == self.root or d == self.root:
            raise ValueError("cannot move the storage root; pass paths below it")
        if d.exists():
            raise FileExistsError(f"cannot move {src!r} to {dst!r}: the target exists")
        self._makedirs(d.parent)
        os.rename(s, d)
        # Both directories changed: fsync the target first so that after a crash the
        # entry exists in at least one place.
        _fsync_dir(d.parent)
        _fsync_dir(s.parent)

    def remove_tree(self, reldir: str) -> None:
        p = self._abs(reldir)
        if p == self.root:
            raise ValueError("cannot remove the storage root; pass a directory below it")
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        else:
            return
        _fsync_dir(p.parent)

    def local_path(self, relpath: str) -> Path | None:
        return self._abs(relpath)
