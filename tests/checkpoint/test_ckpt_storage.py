"""The storage contract: containment, atomic writes, listing, moves. Every backend runs it."""

from __future__ import annotations

import pytest

from segue.checkpoint import CheckpointStorage
from segue.checkpoint.storage import TEMP_MARK


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "a/..", "/abs", "/", "a\\..\\b", "C:/x"])
def test_paths_outside_the_root_are_rejected(storage: CheckpointStorage, bad: str) -> None:
    for op in (storage.read_bytes, storage.exists, storage.size, storage.listdir):
        with pytest.raises(
            ValueError, match=r"^storage path .* (is absolute|leaves the storage root)"
        ):
            op(bad)
    with pytest.raises(ValueError, match=r"^storage path "):
        storage.write_bytes_atomic(bad, b"x")


def test_write_read_roundtrip_and_listing(storage: CheckpointStorage) -> None:
    storage.write_bytes_atomic("a/b/c.bin", b"hello")
    assert storage.read_bytes("a/b/c.bin") == b"hello"
    assert storage.size("a/b/c.bin") == 5 and storage.exists("a/b/c.bin")
    assert storage.listdir("a") == ["b"] and storage.listdir("nope") == []
    storage.write_bytes_atomic("a/b/c.bin", b"bye")  # replace is atomic, not an error
    assert storage.read_bytes("a/b/c.bin") == b"bye"


def test_failed_write_leaves_neither_file_nor_temp(storage: CheckpointStorage) -> None:
    storage.write_bytes_atomic("d/keep.bin", b"old")
    with pytest.raises(RuntimeError), storage.open_write("d/keep.bin") as f:
        f.write(b"new but torn")
        raise RuntimeError("crash mid-write")
    assert storage.read_bytes("d/keep.bin") == b"old"
    assert storage.listdir("d") == ["keep.bin"]


def test_before_publish_failure_discards_the_temp(storage: CheckpointStorage) -> None:
    def boom() -> None:
        assert not storage.exists("d/x.bin")  # durable (local: as a temp) but unpublished
        if storage.local_path("") is not None:
            assert any(TEMP_MARK in n for n in storage.listdir("d"))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        storage.write_bytes_atomic("d/x.bin", b"data", before_publish=boom)
    assert storage.listdir("d") == []


def test_move_and_remove_tree(storage: CheckpointStorage) -> None:
    storage.write_bytes_atomic("src/f.bin", b"1")
    storage.move("src", "q/dst")
    assert storage.read_bytes("q/dst/f.bin") == b"1" and not storage.exists("src")
    storage.write_bytes_atomic("other/f.bin", b"2")
    with pytest.raises(
        FileExistsError, match=r"^cannot move 'other' to 'q/dst': the target exists$"
    ):
        storage.move("other", "q/dst")
    storage.remove_tree("q")
    storage.remove_tree("q")  # already gone: not an error
    assert storage.listdir("") == ["other"]
    with pytest.raises(ValueError, match=r"^cannot remove the storage root"):
        storage.remove_tree("")
