"""start_writeback: a save's blobs go to the device while later ones are written."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from segue import checkpoint as ckpt
from segue._atomic import _sync_file_range, start_writeback
from segue.checkpoint import blobs as blobs_mod
from segue.checkpoint import storage as storage_mod
from segue.checkpoint import writer as writer_mod


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_linux_writeback_is_found_and_leaves_the_bytes_as_written(tmp_path: Path) -> None:
    # Not found, the writer silently loses its overlap of copying and device writes
    # (save_vs_disk fell from 0.9 to 0.75): this says so in CI instead.
    assert _sync_file_range() is not None
    path = tmp_path / "blob"
    data = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.pwrite(fd, data, 0)
        start_writeback(fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == data


def test_a_closed_descriptor_is_an_error_for_the_fsync_not_a_crash(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    start_writeback(fd)  # advisory: returns, whatever the kernel says
    with pytest.raises(OSError):
        os.fsync(fd)


def test_the_next_blob_is_hashed_before_the_writes_of_the_one_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hashing chain runs ahead of the copies: the hash of blob k+1 is queued before
    blob k's writes, so even one thread hashes it first. Queued after them, it waited
    for a free thread until most of a large blob was copied (measured: the second of
    two 64 MiB blobs hashed 17 ms late), and the device ran dry between blobs."""
    monkeypatch.setattr(blobs_mod, "CHUNK", 64 << 10)  # 16 write jobs per blob
    events: list[tuple[str, str]] = []
    real_hash, real_write = writer_mod.hash_blob, storage_mod._LocalBlobWriter.write_at

    def hash_blob(p: Any) -> str:
        key = real_hash(p)
        events.append(("hashed", key))
        return key

    def write_at(self: Any, offset: int, data: Any) -> None:
        events.append(("write", self.final.name.split(".")[0]))
        real_write(self, offset, data)

    monkeypatch.setattr(writer_mod, "hash_blob", hash_blob)
    monkeypatch.setattr(storage_mod._LocalBlobWriter, "write_at", write_at)
    rng = np.random.default_rng(0)
    state = {f"w{i}": rng.random(1 << 18, dtype=np.float32) for i in range(3)}  # 1 MiB: a blob each
    with ThreadPoolExecutor(1) as pool:
        ckpt.save(ckpt.LocalStorage(tmp_path), "c", state, pool=pool)
    hashed = [key for kind, key in events if kind == "hashed"]
    assert len(hashed) == 3
    assert all(events.count(("write", key)) >= 16 for key in hashed)  # its pieces (and header)
    for k in range(2):
        first_write = events.index(("write", hashed[k]))
        assert events.index(("hashed", hashed[k + 1])) < first_write, events[:8]
    assert ckpt.load(ckpt.LocalStorage(tmp_path), "c").state["w2"].tobytes() == state["w2"].tobytes()
