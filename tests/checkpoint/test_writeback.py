"""start_writeback: a save's blobs go to the device while later ones are written."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from segue._atomic import _sync_file_range, start_writeback


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
