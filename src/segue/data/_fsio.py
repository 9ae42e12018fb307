"""Local-file durability helpers: fsync, atomic publish, a cross-process fence lock.

Sinks stage files next to their destination (same filesystem), so publishing
is a single ``os.replace``; the directory is fsynced so the rename survives a
power cut.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from .._atomic import fsync_dir as fsync_dir
from .._atomic import write_atomic as write_atomic
from ..errors import FencedError


@contextmanager
def fence(directory: str, epoch: int, *, advance: bool) -> Iterator[None]:
    """Hold the directory's fence lock; FencedError if a newer epoch owns it.

    ``advance`` records ``epoch`` as the owner (done at recovery). The lock
    makes check-then-publish atomic against another process on this host.
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "FENCE")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 64, 0).decode().strip()
        current = int(raw) if raw else 0
        if current > epoch:
            raise FencedError(
                f"publish from epoch {epoch} rejected: epoch {current} owns {directory}; this attempt must stop"
            )
        if advance and current != epoch:
            data = str(epoch).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        yield
    finally:
        os.close(fd)  # closing releases the flock
