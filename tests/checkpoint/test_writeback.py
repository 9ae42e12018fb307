"""start_writeback: a save's blobs go to the device while later ones are written."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from segue import _faults
from segue import checkpoint as ckpt
from segue._atomic import _sync_file_range, start_writeback
from segue.checkpoint import blobs as blobs_mod
from segue.checkpoint import storage as storage_mod
from segue.checkpoint import writer as writer_mod
from segue.checkpoint.retention import temp_files


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

    rng = np.random.default_rng(0)
    state = {f"w{i}": rng.random(1 << 18, dtype=np.float32) for i in range(3)}  # 1 MiB: a blob each
    # Not an empty store, and no history: no blob is written before it is hashed.
    ckpt.save(ckpt.LocalStorage(tmp_path), "other", {"x": np.arange(1 << 18, dtype=np.float32)})
    monkeypatch.setattr(writer_mod, "hash_blob", hash_blob)
    monkeypatch.setattr(storage_mod._LocalBlobWriter, "write_at", write_at)
    with ThreadPoolExecutor(1) as pool:
        ckpt.save(ckpt.LocalStorage(tmp_path), "c", state, pool=pool)
    hashed = [key for kind, key in events if kind == "hashed"]
    assert len(hashed) == 3
    assert all(events.count(("write", key)) >= 16 for key in hashed)  # its pieces (and header)
    for k in range(2):
        first_write = events.index(("write", hashed[k]))
        assert events.index(("hashed", hashed[k + 1])) < first_write, events[:8]
    assert ckpt.load(ckpt.LocalStorage(tmp_path), "c").state["w2"].tobytes() == state["w2"].tobytes()


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.random(1 << 20, dtype=np.float32), "b": rng.random(1 << 18, dtype=np.float32)}


def _hash_waits_for_unnamed_bytes(monkeypatch: pytest.MonkeyPatch) -> tuple[
        threading.Event, threading.Event, list[bool]]:
    """Once armed, each hash waits (bounded) until a byte of an unnamed blob landed: if
    writes waited for the hash, that never happens and the wait times out (False)."""
    real_hash, real_write = writer_mod.hash_blob, storage_mod._LocalBlobWriter.write_at
    landed, armed, waited = threading.Event(), threading.Event(), []

    def hash_blob(p: Any) -> str:
        if armed.is_set():
            waited.append(landed.wait(30))
        return real_hash(p)

    def write_at(self: Any, offset: int, data: Any) -> None:
        real_write(self, offset, data)
        if self.final is None:
            landed.set()

    monkeypatch.setattr(writer_mod, "hash_blob", hash_blob)
    monkeypatch.setattr(storage_mod._LocalBlobWriter, "write_at", write_at)
    return landed, armed, waited


def test_a_blob_new_at_the_last_save_is_written_while_it_is_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights that changed at the last save are written before their hash is known
    (to an unnamed temp file, named once hashed): the hash holds up no byte."""
    storage = ckpt.LocalStorage(tmp_path)
    ckpt.save(storage, "other", {"x": np.arange(1 << 18, dtype=np.float32)})  # not an empty store
    landed, armed, waited = _hash_waits_for_unnamed_bytes(monkeypatch)
    cp = ckpt.Checkpointer(storage)
    try:
        cp.save("s1", _weights(1))
        assert not landed.is_set()  # no history yet: every blob hashed, then written
        armed.set()
        second = _weights(2)
        got = cp.save("s2", second)
    finally:
        cp.close()
    assert waited and all(waited), "a blob's hash waited for bytes that were never written before it"
    assert got.stats.blobs_written == 2 and got.stats.blobs_reused == 0
    assert temp_files(storage) == []
    back = ckpt.load(storage, "s2").state
    assert all(back[k].tobytes() == second[k].tobytes() for k in second)


def test_the_first_save_into_an_empty_store_is_written_while_it_is_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing stored, nothing to find: a job's first save writes every blob as it hashes it."""
    _, armed, waited = _hash_waits_for_unnamed_bytes(monkeypatch)
    armed.set()
    state = _weights(1)
    with ThreadPoolExecutor(4) as pool:
        got = ckpt.save(ckpt.LocalStorage(tmp_path), "s1", state, pool=pool)
    assert waited and all(waited), "a blob's hash waited for bytes that were never written before it"
    assert got.stats.blobs_written == 2 and temp_files(ckpt.LocalStorage(tmp_path)) == []
    back = ckpt.load(ckpt.LocalStorage(tmp_path), "s1").state
    assert all(back[k].tobytes() == state[k].tobytes() for k in state)


def _count_guesses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Blobs started on a guess (unnamed), counted as they start."""
    started: list[int] = []
    real = storage_mod.LocalStorage.start_blob

    def start_blob(self: Any, reldir: str, size: int) -> Any:
        started.append(size)
        return real(self, reldir, size)

    monkeypatch.setattr(storage_mod.LocalStorage, "start_blob", start_blob)
    return started


def test_a_guess_that_loses_is_dropped_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A blob written on a guess that turns out to exist already (the weights did
    not change this time) is dropped: reused, not written again, no temp file left."""
    guesses = _count_guesses(monkeypatch)
    storage = ckpt.LocalStorage(tmp_path)
    cp = ckpt.Checkpointer(storage)
    try:
        cp.save("s1", _weights(1))
        same = _weights(2)
        first = cp.save("s2", same)  # both blobs new: both guessed new at the next save
        blob = tmp_path / first.manifest.arrays["a0"].file
        before = blob.stat()
        n = len(guesses)
        again = cp.save("s2b", {k: v.copy() for k, v in same.items()})
        assert len(guesses) == n + 2  # both guessed, both lost
        assert again.stats.blobs_reused == 2 and again.stats.written_bytes == 0
        assert temp_files(storage) == []
    finally:
        cp.close()
    assert (blob.stat().st_ino, blob.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    back = ckpt.load(storage, "s2b").state
    assert all(back[k].tobytes() == same[k].tobytes() for k in same)


def test_a_failure_during_a_guessed_write_leaves_the_last_checkpoint_and_no_temp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    guesses = _count_guesses(monkeypatch)
    storage = ckpt.LocalStorage(tmp_path)
    cp = ckpt.Checkpointer(storage)
    try:
        first = _weights(1)
        cp.save("s1", first)
        cp.save("s2", _weights(2))
        n = len(guesses)
        _faults.rearm("checkpoint.pwrite:enospc:2")  # a full disk in the guessed writes
        with pytest.raises(OSError, match="No space left"):
            cp.save("s3", _weights(3))
        assert _faults._hits.get("checkpoint.pwrite", 0) >= 2  # the fault landed
        assert len(guesses) > n  # in a save that wrote on a guess
    finally:
        _faults.rearm("")
        cp.close()
    assert temp_files(storage) == [] and not storage.exists("s3/MANIFEST.json")
    assert ckpt.load(storage, "s1").state["w"].tobytes() == first["w"].tobytes()


def test_the_empty_store_question_is_not_asked_where_no_blob_is_guessed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JSON-only state (a data step's, saved every second) has no blob to guess: its
    saves never list the blob directory; a writer that saved blobs here asks no more."""
    listed: list[str] = []
    real = storage_mod.LocalStorage.listdir

    def listdir(self: Any, reldir: str) -> list[str]:
        listed.append(reldir)
        return real(self, reldir)

    monkeypatch.setattr(storage_mod.LocalStorage, "listdir", listdir)
    storage = ckpt.LocalStorage(tmp_path)
    with ckpt.Checkpointer(storage) as cp:
        for i in range(3):
            cp.save(f"j{i}", {"offset": i, "file": "part-0001.jsonl"})
        assert "blobs" not in listed
        cp.save("w1", _weights(1))  # the first blobs: asked once
        assert listed.count("blobs") == 1
        cp.save("w2", {k: v.copy() for k, v in _weights(1).items()})  # frozen: all reused
        cp.save("w3", {k: v.copy() for k, v in _weights(1).items()})
    assert listed.count("blobs") == 1


def test_each_large_piece_starts_for_the_device_as_it_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device starts on a blob's first piece, not once its last is copied, whether
    the blob is named (hashed first) or written on a guess while it is hashed."""
    monkeypatch.setattr(blobs_mod, "CHUNK", storage_mod.WRITEBACK_BYTES)
    events: list[tuple[str, int, int]] = []  # ("piece" | "range", offset, bytes)
    real_wb, real_write = storage_mod.start_writeback, storage_mod._LocalBlobWriter.write_at

    def start_writeback(fd: int, offset: int = 0, nbytes: int = 0) -> None:
        if nbytes:
            events.append(("range", offset, nbytes))
        real_wb(fd, offset, nbytes)

    def write_at(self: Any, offset: int, data: Any) -> None:
        events.append(("piece", offset, memoryview(data).nbytes))
        real_write(self, offset, data)

    monkeypatch.setattr(storage_mod, "start_writeback", start_writeback)
    monkeypatch.setattr(storage_mod._LocalBlobWriter, "write_at", write_at)
    w = np.random.default_rng(0).random(1 << 20, dtype=np.float32)  # 4 MiB: 4 pieces
    storage = ckpt.LocalStorage(tmp_path)
    for path, state in (("first", {"w": w}), ("named", {"w2": w + 1})):
        # "first": an empty store, written on a guess; "named": hashed, then written.
        events.clear()
        with ThreadPoolExecutor(1) as pool:  # one thread: a piece's range comes next
            ckpt.save(storage, path, state, pool=pool)
        big = [(off, n) for kind, off, n in events if kind == "piece" and n >= storage_mod.WRITEBACK_BYTES]
        assert len(big) == 4, events
        for off, n in big:
            assert events[events.index(("piece", off, n)) + 1] == ("range", off, n)
    assert ckpt.load(storage, "first").state["w"].tobytes() == w.tobytes()
    assert ckpt.load(storage, "named").state["w2"].tobytes() == (w + 1).tobytes()


def test_the_manifest_is_staged_while_the_blobs_are_fsynced_and_linked_after_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest's temp file is written and fsynced beside the blobs' fsyncs (its
    own fsync came last, after them); its link, the publish, still comes after every
    blob is durable and in place."""
    events: list[str] = []
    staged = threading.Event()
    real_sync = storage_mod._LocalBlobWriter.sync
    real_staged_init = storage_mod._LocalStaged.__init__
    real_fsync_dir, real_link = storage_mod.fsync_dir, os.link

    def sync(self: Any) -> None:
        # Held until the manifest is staged: staged after the blobs, it never would be.
        events.append("blob sync waited: " + str(staged.wait(30)))
        real_sync(self)
        events.append("blob synced")

    def staged_init(self: Any, *a: Any) -> None:
        real_staged_init(self, *a)
        events.append("manifest staged")
        staged.set()

    def fsync_dir(path: Any) -> None:
        real_fsync_dir(path)
        events.append("dir synced")

    def link(src: Any, dst: Any) -> None:
        events.append("manifest linked")
        real_link(src, dst)

    monkeypatch.setattr(storage_mod._LocalBlobWriter, "sync", sync)
    monkeypatch.setattr(storage_mod._LocalStaged, "__init__", staged_init)
    monkeypatch.setattr(storage_mod, "fsync_dir", fsync_dir)
    monkeypatch.setattr(storage_mod.os, "link", link)
    state = _weights(1)
    with ThreadPoolExecutor(4) as pool:
        ckpt.save(ckpt.LocalStorage(tmp_path), "c", state, pool=pool)
    assert events.count("blob sync waited: True") == 2, events
    linked = events.index("manifest linked")
    assert events.index("manifest staged") < max(i for i, e in enumerate(events) if e == "blob synced")
    last_blob = max(i for i, e in enumerate(events) if e in ("blob synced", "dir synced") and i < linked)
    assert all(e != "blob synced" for e in events[linked:]) and last_blob < linked
    assert events[linked + 1:] == ["dir synced"]  # the manifest's directory, once linked
    back = ckpt.load(ckpt.LocalStorage(tmp_path), "c").state
    assert all(back[k].tobytes() == state[k].tobytes() for k in state)
