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


def test_local_blobs_are_synced_before_their_directories(tmp_path, monkeypatch) -> None:
    """A batch of blobs commits as: every file fsynced, every rename, then each changed
    directory fsynced once (the new shard directories' parent included), so no
    directory entry is synced before the file it names is in place."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    import segue.checkpoint.storage as st

    log: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # records what each fsync made durable, then does it
        path = os.readlink(f"/proc/self/fd/{fd}")
        log.append(("dir" if os.path.isdir(path) else "file", path))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    storage = st.LocalStorage(tmp_path)
    paths = [f"blobs/{k:02x}/blob{k}" for k in range(6)]
    writers = [storage.create_blob(p, 10) for p in paths]
    assert not any(kind == "dir" for kind, _ in log), "directories are synced at commit"
    for w in writers:
        w.write_at(0, b"0123456789")
    with ThreadPoolExecutor(3) as pool:
        storage.commit_blobs(writers, pool)
    kinds = [kind for kind, _ in log]
    assert kinds == ["file"] * 6 + ["dir"] * len(kinds[6:])
    assert all(TEMP_MARK in path for kind, path in log if kind == "file")
    synced = {d for kind, d in log if kind == "dir"}
    assert synced == {str(tmp_path / "blobs"), str(tmp_path)} | {
        str(tmp_path / "blobs" / f"{k:02x}") for k in range(6)}
    assert all((tmp_path / p).read_bytes() == b"0123456789" for p in paths)
    assert not [p for p in tmp_path.rglob("*") if st.TEMP_MARK in p.name]
