"""Scratch directories saved with a checkpoint (segue.checkpoint.scratch), on real files:
the copy is the file as it was when the snapshot was taken, whatever is written after;
every file is a blob listed with size and checksum in the manifest, and an unchanged file
is not written again; too large, a symlink, or a rotten blob are refused with one line.
The flow-level behaviour (SIGKILL, pause, quarantine) is tests/integration/test_scratch.py.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from segue import checkpoint as ckpt
from segue.checkpoint import scratch
from segue.errors import CheckpointCorruptError, FlowError
from segue.flow.model import Flow


def _fill(root: Path) -> None:
    (root / "cache" / "deep").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "cache" / "deep" / "a.bin").write_bytes(os.urandom(3 << 20))  # more than a pack
    (root / "notes.txt").write_text("hello\n")
    (root / "empty.txt").write_bytes(b"")
    os.chmod(root / "notes.txt", 0o600)


def _tree(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def test_round_trip_every_storage(storage: ckpt.CheckpointStorage, tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    _fill(src)
    want = _tree(src)
    mtime = (src / "notes.txt").stat().st_mtime_ns
    snap = scratch.snapshot(src, tmp_path / "snap", limit=10 << 20)
    assert snap.nbytes == (3 << 20) + 6
    with ckpt.Checkpointer(storage) as w:
        res = w.save("c/1", {"x": 1}, meta={scratch.META_KEY: snap.listing}, blobs=snap.plans)
    snap.discard()
    assert not (tmp_path / "snap").exists()
    for f in snap.listing["files"].values():  # each file: a blob of the manifest, size and hash
        assert res.manifest.files[f["blob"]] == ckpt.FileEntry(f["size"], f["xxh3_128"])
    loaded = ckpt.load(storage, "c/1")  # verifies every file, the scratch blobs included
    assert loaded.state == {"x": 1}
    (out / "stale").mkdir(parents=True)
    (out / "stale" / "old.txt").write_text("left by an earlier attempt")
    assert scratch.restore(storage, "c/1", loaded.manifest, out) == snap.nbytes
    assert _tree(out) == want  # exactly: the stale file is gone, empty dirs and files kept
    assert (out / "notes.txt").stat().st_mode & 0o777 == 0o600
    assert (out / "notes.txt").stat().st_mtime_ns == mtime


def test_the_copy_is_taken_at_the_call(tmp_path: Path) -> None:
    """The background write runs only after the file changed (held behind an earlier
    save's on_durable): the checkpoint still holds the bytes of the snapshot's moment."""
    storage = ckpt.LocalStorage(tmp_path / "store")
    src = tmp_path / "src"
    src.mkdir()
    log = src / "log.txt"
    log.write_text("line 1\n")
    big = src / "big.bin"  # copied on disk, not read into memory
    before = os.urandom(scratch.SMALL_BYTES + 4096)
    big.write_bytes(before)
    gate = threading.Event()
    with ckpt.Checkpointer(storage, max_in_flight=2) as w:
        w.save_async("c/0", {"x": 0}, on_durable=lambda _: gate.wait(30))
        snap = scratch.snapshot(src, tmp_path / "snap", limit=10 << 20)
        fut = w.save_async("c/1", {"x": 1}, meta={scratch.META_KEY: snap.listing}, blobs=snap.plans)
        fut.add_done_callback(lambda _: snap.discard())
        assert not fut.done()  # queued behind c/0, which waits for the gate
        with open(log, "a") as f:
            f.write("line 2\n")  # after ctx.checkpoint returned, before the write
        log.unlink()
        log.write_text("replaced\n")
        with open(big, "r+b") as f:  # in place: a hard link would share these bytes
            f.write(b"\0" * 8192)
        gate.set()
        fut.result()
    out = tmp_path / "out"
    scratch.restore(storage, "c/1", ckpt.load(storage, "c/1").manifest, out)
    assert (out / "log.txt").read_text() == "line 1\n"
    assert (out / "big.bin").read_bytes() == before


def test_an_unchanged_file_is_not_written_again(tmp_path: Path) -> None:
    storage = ckpt.LocalStorage(tmp_path / "store")
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.bin").write_bytes(os.urandom(2 << 20))
    (src / "log.txt").write_text("a\n")
    with ckpt.Checkpointer(storage) as w:
        stats = []
        for i in range(2):
            snap = scratch.snapshot(src, tmp_path / f"snap{i}", limit=10 << 20)
            stats.append(w.save(f"c/{i}", {"i": i}, meta={scratch.META_KEY: snap.listing},
                                blobs=snap.plans).stats)
            snap.discard()
            (src / "log.txt").write_text("a\nb\n")
    assert stats[0] is not None and stats[1] is not None
    assert stats[0].written_bytes >= 2 << 20
    assert stats[1].written_bytes == len("a\nb\n")  # only the changed file
    assert stats[1].reused_bytes == 2 << 20


def test_over_the_limit_nothing_is_copied(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"x" * 600)
    (src / "b").write_bytes(b"x" * 500)
    with pytest.raises(scratch.ScratchTooLargeError) as e:
        scratch.snapshot(src, tmp_path / "snap", limit=1000, what="ctx.scratch of step 's'",
                         fix="declare more")
    assert str(e.value) == ("ctx.scratch of step 's' holds 1.1 kB (1100 bytes in 2 files) at the "
                            "checkpoint, over its limit of 1.0 kB (1000 bytes); declare more")
    assert not e.value.segue_retryable
    assert not (tmp_path / "snap").exists()


def test_a_symlink_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "link").symlink_to(tmp_path)
    with pytest.raises(scratch.ScratchFileError, match="holds a symlink, 'link', and only regular files"):
        scratch.snapshot(src, tmp_path / "snap", limit=1000)


def test_a_rotten_blob_is_caught(tmp_path: Path) -> None:
    storage = ckpt.LocalStorage(tmp_path / "store")
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("some bytes\n")
    snap = scratch.snapshot(src, tmp_path / "snap", limit=1000)
    res = ckpt.save(storage, "c/1", {"x": 1}, meta={scratch.META_KEY: snap.listing})
    assert res.manifest.files == {}  # without blobs=: the listing names nothing stored
    with pytest.raises(CheckpointCorruptError, match="which the manifest does not list"):
        scratch.restore(storage, "c/1", res.manifest, tmp_path / "out")
    with ckpt.Checkpointer(storage) as w:
        m = w.save("c/2", {"x": 2}, meta={scratch.META_KEY: snap.listing}, blobs=snap.plans).manifest
    blob = tmp_path / "store" / snap.listing["files"]["f.txt"]["blob"]
    os.chmod(blob, 0o644)
    blob.write_bytes(b"some bytez\n")
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch"):
        ckpt.load(storage, "c/2")
    out = tmp_path / "out"
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch"):
        scratch.restore(storage, "c/2", m, out)
    assert list(out.iterdir()) == []  # nothing half restored


def test_declaration() -> None:
    flow = Flow("f")

    @flow.step(scratch="2GB")
    def a(ctx):  # type: ignore[no-untyped-def]
        return None

    @flow.step
    def b(ctx):  # type: ignore[no-untyped-def]
        return None

    def c(ctx):  # type: ignore[no-untyped-def]
        return None

    assert flow.steps["a"].scratch == 2_000_000_000 and flow.steps["b"].scratch is None
    with pytest.raises(FlowError, match="scratch is not supported with world_size > 1"):
        flow.step(world_size=2, scratch="1GB")(c)
    with pytest.raises(FlowError, match="scratch must be a size such as 80GB"):
        flow.step(scratch="lots")(c)
    with pytest.raises(FlowError, match="scratch must be a size above 0"):
        flow.step(scratch=0)(c)
    assert "c" not in flow.steps  # nothing half declared


def test_a_map_step_has_no_scratch() -> None:
    import segue.data  # noqa: F401 - hands flow the class @flow.map builds

    flow = Flow("f")
    with pytest.raises(FlowError, match="scratch= applies to @flow.step functions"):
        @flow.map(source=lambda ctx: None, sink=lambda ctx: None, scratch="1GB")
        def double(record):  # type: ignore[no-untyped-def]
            return record * 2
