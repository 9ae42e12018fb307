"""Format v2: incremental saves, async saves, retention and GC, v1 compatibility."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import assert_same

from segue.checkpoint import (
    Checkpointer,
    CheckpointInfo,
    CheckpointStorage,
    LocalStorage,
    RetentionPolicy,
    collect_garbage,
    latest_valid,
    list_dir_checkpoints,
    load,
    plan_retention,
    prune,
    read_manifest,
    save,
    verify,
)
from segue.checkpoint.blobs import BLOB_DIR
from segue.checkpoint.io import SaveResult
from segue.checkpoint.retention import temp_files
from segue.errors import CheckpointCorruptError, CheckpointError, InjectedFault

V1_FIXTURE = Path(__file__).parent / "data" / "v1"


def big_state(step: int, n: int = 10) -> dict[str, object]:
    return {
        "step": step,
        "layers": [np.full(300_000, i, dtype=np.float32) for i in range(n)],  # 1.2 MB each
        "small": {f"b{i}": np.full(8, i, dtype=np.float32) for i in range(50)},
    }


def test_v1_checkpoints_still_load(tmp_path: Path) -> None:
    root = tmp_path / "v1"
    shutil.copytree(V1_FIXTURE, root)
    storage = LocalStorage(root)
    m = verify(storage, "run/c1")
    assert m.version == 1
    got = load(storage, "run/c1", allow_pickle=True).state
    assert got["step"] == 3 and got["opaque"] == {1, 2}
    assert_same(np.arange(40, dtype=np.float32).reshape(4, 10), got["w"])
    assert_same(np.array([1, 2, 3], dtype=">i4"), got["b"])


def test_incremental_save_writes_only_changed_blobs(storage: CheckpointStorage) -> None:
    state = big_state(1)
    first = save(storage, "run/c1", state)
    assert first.stats is not None and first.stats.blobs_written == 11  # 10 arrays + 1 pack
    layers = state["layers"]
    assert isinstance(layers, list)
    layers[3] = layers[3] + 100  # (+1 would equal layer 4: deduplicated too)
    second = save(storage, "run/c2", state)
    assert second.stats is not None
    assert second.stats.blobs_written == 1 and second.stats.blobs_reused == 10
    assert second.stats.written_bytes < 0.15 * first.stats.written_bytes
    assert_same(state, load(storage, "run/c2").state)
    assert load(storage, "run/c1").state["layers"][3][0] == 3  # the old one is intact


def test_small_arrays_are_coalesced(storage: CheckpointStorage) -> None:
    state = {f"p{i}": np.full(64, i, dtype=np.float32) for i in range(2000)}
    m = save(storage, "c", state).manifest
    assert len({a.file for a in m.arrays.values()}) == 1


def test_large_array_blob_is_a_safetensors_file_with_aligned_data(tmp_path: Path) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    storage = LocalStorage(tmp_path)
    arr = np.arange(500_000, dtype=np.float64)
    m = save(storage, "c", {"x": arr}).manifest
    path = storage.local_path(m.arrays["a0"].file)
    assert path is not None
    raw = path.read_bytes()
    assert (8 + int.from_bytes(raw[:8], "little")) % 4096 == 0
    assert np.array_equal(safetensors_numpy.load_file(str(path))["data"], arr)


def test_missing_shared_blob_fails_every_checkpoint_that_uses_it(storage: CheckpointStorage) -> None:
    save(storage, "run/c1", big_state(1))
    save(storage, "run/c2", big_state(1))
    blob = read_manifest(storage, "run/c2").arrays["a0"].file
    storage.remove(blob)
    for path in ("run/c1", "run/c2"):
        with pytest.raises(CheckpointCorruptError, match=r"\(blob blobs/\S+: missing\)$"):
            verify(storage, path)
    # the next save notices the blob is gone and writes it again
    save(storage, "run/c3", big_state(1))
    verify(storage, "run/c3")


# -- async ---------------------------------------------------------------------


def test_async_save_returns_after_the_copy_and_reports_durable(storage: CheckpointStorage) -> None:
    state = big_state(1)
    seen: list[str] = []
    with Checkpointer(storage) as ck:
        fut = ck.save_async("run/c1", state, meta={"step": 1},
                            on_durable=lambda r: seen.append(r.path))
        layers = state["layers"]
        assert isinstance(layers, list)
        layers[0][:] = -1  # mutating after return must not leak into the checkpoint
        result = fut.result()
        assert storage.exists("run/c1/MANIFEST.json")  # durable before reported
    assert seen == ["run/c1"]
    assert result.manifest.meta == {"step": 1}
    assert load(storage, "run/c1").state["layers"][0][0] == 0


def test_async_failure_is_raised_at_the_next_call(
    tmp_path: Path, faults: object
) -> None:
    from segue import _faults

    storage = LocalStorage(tmp_path)
    errors: list[tuple[str, BaseException]] = []
    ck = Checkpointer(storage, on_error=lambda p, e: errors.append((p, e)))
    _faults.rearm("checkpoint.blob_written:raise")
    fut = ck.save_async("run/c1", big_state(1))
    with pytest.raises(InjectedFault):
        fut.result()
    _faults.rearm("")
    assert [p for p, _ in errors] == ["run/c1"]
    with pytest.raises(InjectedFault, match=r"^injected fault at checkpoint\.blob_written$"):
        ck.save_async("run/c2", big_state(2))
    ck.save_async("run/c2", big_state(2)).result()  # raised once; then it works again
    ck.close()
    assert list_dir_checkpoints(storage, "run") == ["run/c2"]
    with pytest.raises(CheckpointError, match=r"^checkpointer is closed"):
        ck.save_async("run/c3", {})


def test_a_blocking_save_writes_in_line_after_earlier_saves_and_raises_its_own_failure(
    tmp_path: Path, faults: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpointer.save: the caller waits anyway, so nothing is copied into the host
    buffer first; earlier async saves are durable before it starts; its failure raises
    at once, and not again at the next call."""
    from segue import _faults
    from segue.checkpoint import blobs

    storage = LocalStorage(tmp_path)
    gate = threading.Event()
    staged: list[int] = []
    real_stage = blobs.stage

    def counted_stage(*args: Any) -> Any:
        staged.append(1)
        return real_stage(*args)

    def c1_durable(result: SaveResult) -> None:
        assert gate.wait(10)
        order.append(result.path)

    monkeypatch.setattr(blobs, "stage", counted_stage)
    order: list[str] = []
    with Checkpointer(storage) as ck:
        ck.save_async("run/c1", big_state(1), on_durable=c1_durable)
        waiter = threading.Thread(target=lambda: order.append(ck.save("run/c2", big_state(2)).path))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and order == []  # c2 waits for c1, which waits for the gate
        gate.set()
        waiter.join(30)
        assert order == ["run/c1", "run/c2"]
        assert staged == [1]  # only the async save was staged
        cost = ck.last_cost
        assert cost is not None and cost.path == "run/c2" and cost.background_s == 0.0
        _faults.rearm("checkpoint.blob_written:raise")
        with pytest.raises(InjectedFault):
            ck.save("run/c3", big_state(3))
        _faults.rearm("")
        ck.save("run/c4", big_state(4))  # the failure was raised once, where it happened
    assert list_dir_checkpoints(storage, "run") == ["run/c1", "run/c2", "run/c4"]
    assert load(storage, "run/c2").state["step"] == 2


def test_at_most_n_in_flight(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    gate = threading.Event()
    with Checkpointer(storage, max_in_flight=1) as ck:
        ck.save_async("a", {"x": np.zeros(10)}, on_durable=lambda r: gate.wait(5))
        t = threading.Thread(target=lambda: ck.save_async("b", {"x": np.ones(10)}))
        t.start()
        time.sleep(0.2)
        assert t.is_alive()  # blocked: the one slot is busy
        gate.set()
        t.join(5)
        assert not t.is_alive()
    assert list_dir_checkpoints(storage, "") == ["a", "b"]


# -- retention and GC ------------------------------------------------------------


def infos(n: int, **kw: object) -> list[CheckpointInfo]:
    return [CheckpointInfo(f"c{i}", step=i * 10, **kw) for i in range(1, n + 1)]  # type: ignore[arg-type]


def test_plan_keeps_last_every_and_tagged() -> None:
    ckpts = infos(8)
    ckpts[1] = CheckpointInfo("c2", step=20, tags=("best",))
    plan = plan_retention(ckpts, RetentionPolicy(keep_last=2, keep_every=40))
    assert plan.keep == ["c2", "c4", "c7", "c8"]
    assert plan.delete == ["c1", "c3", "c5", "c6"]
    assert plan.reasons == {"c8": "last", "c7": "last", "c4": "every", "c2": "tag:best"}


def test_plan_never_drops_the_newest_valid_one() -> None:
    ckpts = infos(4)
    ckpts[3] = CheckpointInfo("c4", step=40, valid=False)
    ckpts[2] = CheckpointInfo("c3", step=30, valid=False)
    plan = plan_retention(ckpts, RetentionPolicy(keep_last=1))
    assert plan.keep == ["c2", "c3", "c4"] and plan.delete == ["c1"]
    assert plan.reasons["c2"] == "last"
    with pytest.raises(ValueError, match=r"^keep_last must be >= 1, not 0$"):
        RetentionPolicy(keep_last=0)


def test_prune_then_gc_keeps_exactly_the_live_blobs(storage: CheckpointStorage) -> None:
    state = big_state(0, n=3)
    for i in range(1, 5):
        layers = state["layers"]
        assert isinstance(layers, list)
        layers[i % 3] = layers[i % 3] + 1
        save(storage, f"run/c{i}", state, meta={"step": i})
    report = prune(storage, "run", RetentionPolicy(keep_last=2), grace_s=0)
    assert report.removed == ["run/c1", "run/c2"]
    assert list_dir_checkpoints(storage, "run") == ["run/c3", "run/c4"]
    live = set(read_manifest(storage, "run/c3").files) | set(read_manifest(storage, "run/c4").files)
    left = {i.path for i in storage.walk(BLOB_DIR)}
    assert left == live
    assert report.gc is not None and report.gc.deleted
    for p in ("run/c3", "run/c4"):
        verify(storage, p)


def test_gc_lists_the_blobs_once_and_reads_each_manifest_once(tmp_path: Path) -> None:
    """A store's blobs are most of its files: GC lists them once (as the candidates)
    and finds the manifests and staged temp files without walking them again; the
    look right before deleting reads the pending markers only, not every manifest."""
    walked: list[str] = []
    manifests_read: list[str] = []

    class Counting(LocalStorage):
        def walk(self, reldir: str) -> list[Any]:
            walked.append(reldir)
            return super().walk(reldir)

        def read_bytes(self, relpath: str) -> bytes:
            if relpath.endswith("/MANIFEST.json"):
                manifests_read.append(relpath)
            return super().read_bytes(relpath)

    storage = Counting(tmp_path)
    for i in range(1, 4):  # each with a tensor of its own, and one they share
        save(storage, f"run/c{i}", {"own": np.full(300_000, i, dtype=np.float32),
                                    "shared": np.zeros(1000, dtype=np.float32)})
    gone = read_manifest(storage, "run/c1")
    storage.remove("run/c1/MANIFEST.json")  # c1's own blob is garbage now
    kept = set(read_manifest(storage, "run/c2").files) | set(read_manifest(storage, "run/c3").files)
    walked.clear()
    manifests_read.clear()
    report = collect_garbage(storage, grace_s=0)
    assert report.deleted == sorted(set(gone.files) - kept) and len(report.deleted) == 1
    assert report.kept_live == len(kept)  # (so the second look, before deleting, ran)
    assert walked.count(BLOB_DIR) == 1 and "" not in walked, walked
    assert sorted(manifests_read) == ["run/c2/MANIFEST.json", "run/c3/MANIFEST.json"]
    for p in ("run/c2", "run/c3"):
        verify(storage, p)


def test_gc_grace_period_and_pending_marker_protect_a_concurrent_save(
    tmp_path: Path,
) -> None:
    storage = LocalStorage(tmp_path)
    save(storage, "run/c1", big_state(1, n=2))
    old = read_manifest(storage, "run/c1")
    storage.remove("run/c1/MANIFEST.json")  # c1 is gone: its blobs are garbage now
    # A save that reuses those very bytes runs while GC collects: stop it between
    # writing its pending marker and publishing, and collect right there.
    from segue import _faults

    reports = []

    def gc_now() -> None:
        reports.append(collect_garbage(storage, grace_s=0))

    orig = _faults.fault_point

    def hook(name: str) -> None:
        if name == "checkpoint.blob_written":
            gc_now()
        orig(name)

    import segue.checkpoint.writer as writer

    writer.fault_point = hook  # type: ignore[assignment]
    try:
        save(storage, "run/c2", big_state(1, n=2))
    finally:
        writer.fault_point = orig  # type: ignore[assignment]
    assert reports[0].kept_pending == len(old.files) and not reports[0].deleted
    verify(storage, "run/c2")
    # Without a marker and with the grace period over, the orphans go.
    storage.remove("run/c2/MANIFEST.json")
    assert len(collect_garbage(storage, grace_s=3600).deleted) == 0  # too young
    assert len(collect_garbage(storage, grace_s=0).deleted) == len(old.files)


def test_a_staged_manifest_never_published_is_collected_after_the_grace_period(tmp_path: Path) -> None:
    """A writer killed while its manifest was staged leaves a temp file beside the
    manifest's name: not a checkpoint, never read, and GC's once old enough."""
    storage = LocalStorage(tmp_path)
    save(storage, "run/c1", big_state(0, n=1))
    staged = storage.stage("run/c2/MANIFEST.json", b'{"never": "published"}')
    assert list_dir_checkpoints(storage, "run") == ["run/c1"]
    temps = [n for n in storage.listdir("run/c2") if n.startswith(".MANIFEST.json.tmp-")]
    assert len(temps) == 1 and storage.listdir("run/c2") == temps
    assert collect_garbage(storage, grace_s=3600).deleted == []  # a save may be staging it now
    report = collect_garbage(storage, grace_s=0)
    assert report.deleted == [f"run/c2/{temps[0]}"] and report.freed_bytes == 22
    assert storage.listdir("run/c2") == []
    staged.discard()  # idempotent: the file is gone already
    verify(storage, "run/c1")  # the published checkpoint kept everything
    # A staged manifest publishes once: the name taken, it is refused and removed.
    again = storage.stage("run/c1/MANIFEST.json", b"{}")
    with pytest.raises(FileExistsError):
        again.publish()
    assert storage.listdir("run/c1") == ["MANIFEST.json"]


def test_a_gc_between_a_save_seeing_a_blob_and_its_marker_cannot_lose_the_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer checks which blobs exist while it hashes, before its pending marker
    exists (the marker needs every hash). A GC that runs in between removes blobs the
    save found and means to reuse; the save must notice and write them itself."""
    storage = LocalStorage(tmp_path)
    save(storage, "run/c1", big_state(1, n=2))
    old = read_manifest(storage, "run/c1")
    storage.remove("run/c1/MANIFEST.json")  # c1 is gone: its blobs are garbage now
    reports = []
    real = LocalStorage.write_bytes_atomic

    def gc_first(self: LocalStorage, relpath: str, data: bytes, **kw: object) -> None:
        if relpath.startswith("blobs/pending/") and not reports:
            reports.append(collect_garbage(self, grace_s=0))  # the marker is not there yet
        real(self, relpath, data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalStorage, "write_bytes_atomic", gc_first)
    res = save(storage, "run/c2", big_state(1, n=2))
    assert len(reports) == 1 and len(reports[0].deleted) == len(old.files)  # the GC landed
    assert res.stats is not None and res.stats.blobs_reused == 0  # so nothing was reused
    assert res.stats.written_bytes == res.nbytes
    verify(storage, "run/c2")
    assert_same(load(storage, "run/c2").state["layers"][1], big_state(1, n=2)["layers"][1])


def test_gc_after_a_killed_save_removes_its_leftovers(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    save(storage, "run/c1", big_state(1, n=2))
    child = (
        "import sys, numpy as np\n"
        "from segue.checkpoint import LocalStorage, save\n"
        "save(LocalStorage(sys.argv[1]), 'run/c2', {'x': np.full(400_000, 7, dtype=np.float32)})\n"
    )
    env = {**os.environ, "SEGUE_FAULTS": "checkpoint.blob_tmp:kill"}
    proc = subprocess.run([sys.executable, "-c", child, str(tmp_path)], env=env, timeout=60)
    assert proc.returncode == -9
    assert temp_files(storage) and storage.walk("blobs/pending")
    assert latest_valid(storage, ["run/c2", "run/c1"]) == "run/c1"
    report = collect_garbage(storage, grace_s=0, marker_ttl_s=0)
    assert not temp_files(storage) and not storage.walk("blobs/pending")
    assert report.kept_live == len(read_manifest(storage, "run/c1").files)
    verify(storage, "run/c1")


def test_prune_refuses_when_nothing_verifies(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    for i in (1, 2):
        save(storage, f"run/c{i}", {"x": np.full(10, i)})
    for i in (1, 2):
        for f in read_manifest(storage, f"run/c{i}").files:
            storage.remove(f)
    plan = prune(storage, "run", RetentionPolicy(keep_last=1), grace_s=0).plan
    assert plan.delete == []  # both invalid: kept as evidence, nothing deleted
