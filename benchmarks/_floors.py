"""The disk floor that benchmarks.checkpoint and benchmarks.scale measure segue against:
the same bytes in the same files, written the fastest way known here, with segue's
writer's thread count (so a ratio past it is a measurement error, not speed)."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from segue._atomic import start_writeback
from segue.checkpoint.blobs import CHUNK, LARGE_BYTES


class Layout:
    """The bytes segue writes, laid out as it lays them out: each large array a file of
    its own, the small ones packed in one. Made once, before the clock: the floors get
    the small arrays already packed (segue packs them inside its timed save), so they
    are never slower than the physical work, and no Python loop per small array is timed."""

    def __init__(self, arrs: list[np.ndarray]) -> None:
        self.large = [a for a in arrs if a.nbytes >= LARGE_BYTES]
        self.small = [a for a in arrs if a.nbytes < LARGE_BYTES]
        self.packed = (np.concatenate([bytes_arr(a) for a in self.small]) if self.small
                       else np.empty(0, np.uint8))
        files = [bytes_arr(a) for a in self.large] + ([self.packed] if self.small else [])
        self.sizes = [f.nbytes for f in files]
        # (file, offset, piece) jobs of at most CHUNK bytes
        self.jobs = [(k, s, memoryview(f[s : s + CHUNK])) for k, f in enumerate(files)
                     for s in range(0, f.nbytes, CHUNK)]


def bytes_arr(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def raw_write(root: Path, lay: Layout, pool: ThreadPoolExecutor) -> None:
    """The disk floor: the same bytes in the same files, each file preallocated whole
    (posix_fallocate: all before any byte is written, so no preallocation waits behind
    writeback, and the floor measured the same with or without it; segue's writer
    does not preallocate), pwritten in CHUNK pieces by as many threads
    as segue's writer uses; each piece's writeback started as soon as it is written
    (sync_file_range, as segue's writer does: per file it measured 20-25% faster here
    than writing everything first, and per piece faster again), then every file
    fsynced in parallel. No hashing, no manifest."""
    root.mkdir(parents=True, exist_ok=True)
    fds = [os.open(root / f"f{k}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
           for k in range(len(lay.sizes))]

    def write(job: tuple[int, int, memoryview]) -> None:
        k, offset, piece = job
        os.pwrite(fds[k], piece, offset)
        start_writeback(fds[k], offset, len(piece))

    try:
        for fd, size in zip(fds, lay.sizes, strict=True):
            os.posix_fallocate(fd, 0, size)
        list(pool.map(write, lay.jobs))
        list(pool.map(os.fsync, fds))
    finally:
        for fd in fds:
            os.close(fd)


def drop_file(path: Path) -> None:
    """Flush a file and drop its pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_tree(root: Path) -> None:
    """:func:`drop_file` on every regular file under ``root`` (a FIFO would block its open).

    Besides cold reads, this keeps timed writes fair on this VM: its memory is backed
    by the host only once touched, so a write whose page cache comes from pages the
    guest never used pays for the host's faults (the copies into the page cache ran
    2-6x slower, in system time), while one that reuses pages freed before does not.
    Dropping what earlier saves left gives every side's writes the same warm pages."""
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath, n)
            if stat.S_ISREG(p.lstat().st_mode):
                drop_file(p)


def settle(*roots: Path) -> None:
    """Before a timed write: flush what earlier steps left to the disk (a deleted tree's
    freed blocks, the journal), and drop the files under ``roots`` from the page cache
    (:func:`drop_tree`: the next write then gets warm pages), so no side pays for the
    one before it."""
    os.sync()
    for root in roots:
        drop_tree(root)
