"""The commit protocol: manifest last, everything verified, bad checkpoints never used."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import xxhash
from ckpt_helpers import assert_same

from segue.checkpoint import (
    FORMAT,
    VERSION,
    CheckpointStorage,
    LocalStorage,
    Manifest,
    latest_valid,
    list_dir_checkpoints,
    load,
    quarantine,
    read_manifest,
    save,
    verify,
)
from segue.errors import CheckpointCorruptError, CheckpointError, StateTypeError

STATE = {
    "step": 3,
    "w": np.arange(40, dtype=np.float32).reshape(4, 10),  # small: packed
    "big": np.arange(300_000, dtype=np.float32),  # >= 1 MiB: a blob of its own
    "opaque": {1, 2},
}


def file_of(storage: CheckpointStorage, path: str, kind: str) -> str:
    """The storage path of the file of ``kind`` (manifest, pack, array, opaque) of a checkpoint."""
    if kind == "manifest":
        return f"{path}/MANIFEST.json"
    m = read_manifest(storage, path)
    if kind == "opaque":
        return next(f for f in m.files if f.endswith(".bin"))
    ref = "a0" if kind == "pack" else "a1"  # tree order: w, then big
    return m.arrays[ref].file


def saved(storage: CheckpointStorage, path: str = "run/c1") -> str:
    return save(storage, path, STATE, meta={"run_id": "r", "step": 3}, allow_pickle=True).path


def test_save_result_and_manifest(storage: CheckpointStorage) -> None:
    result = save(storage, "run/c1", STATE, meta={"step": 3}, allow_pickle=True)
    assert result.path == "run/c1"
    assert len(result.files) == 3  # the pack of small arrays, the big array, the pickles
    assert all(n.startswith("blobs/") for n in result.files)
    assert result.nbytes == sum(storage.size(n) for n in result.files)
    assert result.stats is not None and result.stats.written_bytes == result.nbytes
    m = read_manifest(storage, "run/c1")
    assert m == result.manifest == verify(storage, "run/c1")
    assert (m.format, m.version, m.meta) == (FORMAT, VERSION, {"step": 3})
    assert {"python", "numpy", "segue"} <= m.versions.keys()
    assert m.arrays["a0"].dtype == "<f4" and m.arrays["a0"].shape == (4, 10)
    loaded = load(storage, "run/c1", allow_pickle=True)
    assert loaded.manifest == m
    assert_same(STATE, loaded.state)


def test_json_only_state_has_just_a_manifest(storage: CheckpointStorage) -> None:
    save(storage, "c", {"position": 12, "name": "x"})
    assert storage.listdir("c") == ["MANIFEST.json"]
    assert load(storage, "c").state == {"position": 12, "name": "x"}


def test_checkpoints_are_immutable(storage: CheckpointStorage) -> None:
    saved(storage)
    with pytest.raises(
        CheckpointError,
        match=r"^checkpoint run/c1 already exists and "
        r"checkpoints are immutable; save to a new path$",
    ):
        save(storage, "run/c1", {"x": 1})


def test_meta_must_be_json(storage: CheckpointStorage) -> None:
    with pytest.raises(StateTypeError, match=r"^checkpoint meta must be plain JSON"):
        save(storage, "c", {}, meta={"loss": float("nan")})
    assert storage.listdir("") == []


def test_manifest_missing_means_no_checkpoint(storage: CheckpointStorage) -> None:
    with pytest.raises(
        CheckpointCorruptError,
        match=r"^checkpoint nope failed verification "
        r"\(manifest missing\)$",
    ):
        verify(storage, "nope")


def test_newer_format_version_asks_to_upgrade(storage: CheckpointStorage) -> None:
    path = saved(storage)
    body = json.loads(storage.read_bytes(f"{path}/MANIFEST.json"))
    body["version"] = VERSION + 1
    del body["checksum"]  # a newer writer signs what it writes
    body["checksum"] = xxhash.xxh3_128_hexdigest(
        json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    )
    storage.remove_tree(f"{path}/MANIFEST.json")
    storage.write_bytes_atomic(f"{path}/MANIFEST.json", json.dumps(body).encode())
    with pytest.raises(
        CheckpointError,
        match=rf"^checkpoint format version {VERSION + 1} is newer than this "
        rf"segue reads \(up to {VERSION}\); upgrade segue to load it$",
    ):
        load(storage, path)
    # not "corrupt": a newer checkpoint must not be skipped in favour of an older one
    with pytest.raises(CheckpointError):
        latest_valid(storage, [path])


def test_manifest_json_roundtrip(storage: CheckpointStorage) -> None:
    m = read_manifest(storage, saved(storage))
    assert Manifest.from_json(m.to_json()) == m


def test_manifest_checksum_is_the_compact_json_of_every_other_field(tmp_path: Path) -> None:
    """The checksum's definition (docs/checkpoint-format.md), computed here independently
    of the writer, which encodes each field once: non-ASCII text, nesting, key order."""
    storage = LocalStorage(tmp_path)
    state = {"zé": [1.5, {"b": None, "a": "naïve ✓"}], "w": np.arange(3.0)}
    res = save(storage, "c", state, meta={"note": "Straße", "n": 2}, tags=("ü",))
    text = storage.read_bytes("c/MANIFEST.json").decode()
    body = json.loads(text)
    stored = body.pop("checksum")
    assert stored == xxhash.xxh3_128_hexdigest(
        json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode())
    assert list(body)[-1] == "tags" and "naïve ✓" in text  # written as UTF-8, not escaped
    assert Manifest.from_json(text) == res.manifest


def corrupt(storage: CheckpointStorage, rel: str, how: str, pos: int = 0) -> None:
    data = bytearray(storage.read_bytes(rel))
    if how == "flip":
        data[pos] ^= 0x01
    else:
        data = data[: len(data) // 2]
    storage.write_bytes_atomic(rel, bytes(data))


DETAILS = {
    ("pack", "flip"): r"blob blobs/\S+\.safetensors: checksum mismatch",
    ("pack", "truncate"): r"blob blobs/\S+\.safetensors: size \d+ != \d+",
    ("array", "flip"): r"blob blobs/\S+\.safetensors: checksum mismatch",
    ("array", "truncate"): r"blob blobs/\S+\.safetensors: size \d+ != \d+",
    ("opaque", "flip"): r"blob blobs/\S+\.bin: checksum mismatch",
    ("opaque", "truncate"): r"blob blobs/\S+\.bin: size \d+ != \d+",
    ("manifest", "flip"): r"manifest unreadable: .*",
    ("manifest", "truncate"): r"manifest unreadable: .*",
}


def positions(storage: CheckpointStorage, size: int) -> list[int]:
    # Every byte of small files on local disk; a spread of bytes elsewhere (each flip
    # is a round trip to the server) and in the MiB-sized array blob.
    if size <= 2048 and storage.local_path("") is not None:
        return list(range(size))
    if storage.local_path("") is None:
        return sorted({0, 9, size // 3, size // 2, size - 1})
    step = max(1, size // 64)
    return sorted({*range(min(size, 64)), *range(0, size, step), *range(max(0, size - 64), size)})


@pytest.mark.parametrize(("kind", "how"), sorted(DETAILS))
def test_corruption_is_detected(storage: CheckpointStorage, kind: str, how: str) -> None:
    path = saved(storage)
    rel = file_of(storage, path, kind)
    size = storage.size(rel)
    pattern = rf"^checkpoint run/c1 failed verification \({DETAILS[kind, how]}\)$"
    original = storage.read_bytes(rel)
    for pos in positions(storage, size) if how == "flip" else [0]:
        corrupt(storage, rel, how, pos)
        with pytest.raises(CheckpointCorruptError, match=pattern):
            verify(storage, path)
        with pytest.raises(CheckpointCorruptError, match=pattern):
            load(storage, path, allow_pickle=True)
        storage.write_bytes_atomic(rel, original)
    assert_same(STATE, load(storage, path, allow_pickle=True).state)


def test_unverified_load_still_rejects_a_truncated_tensor_file(storage: CheckpointStorage) -> None:
    path = saved(storage)
    corrupt(storage, file_of(storage, path, "array"), "truncate")
    with pytest.raises(CheckpointCorruptError, match=r"\(blob blobs/\S+: file ends "):
        load(storage, path, allow_pickle=True, verify=False)


def test_missing_data_file_is_detected(storage: CheckpointStorage) -> None:
    path = saved(storage)
    storage.remove(file_of(storage, path, "opaque"))
    with pytest.raises(CheckpointCorruptError, match=r"\(blob blobs/\S+\.bin: missing\)$"):
        verify(storage, path)


def test_latest_valid_skips_and_reports_bad_ones(storage: CheckpointStorage) -> None:
    for i in range(1, 6):
        save(storage, f"run/c{i}", {"i": i, "w": np.full(3, i)})
    corrupt(storage, file_of(storage, "run/c5", "pack"), "flip", 100)
    corrupt(storage, "run/c4/MANIFEST.json", "truncate")
    storage.remove_tree("run/c3/MANIFEST.json")
    ckpts = list_dir_checkpoints(storage, "run")
    assert ckpts == ["run/c1", "run/c2", "run/c4", "run/c5"]  # c3 has no manifest: not a checkpoint
    bad: list[tuple[str, str]] = []
    best = latest_valid(
        storage,
        ["run/c5", "run/c4", "run/c3", "run/c2", "run/c1"],
        on_bad=lambda p, e: bad.append((p, e.detail)),
    )
    assert best == "run/c2"
    assert [p for p, _ in bad] == ["run/c5", "run/c4", "run/c3"]
    assert re.fullmatch(r"blob blobs/\S+\.safetensors: checksum mismatch", bad[0][1])
    assert bad[2][1] == "manifest missing"
    assert load(storage, best).state["i"] == 2
    assert latest_valid(storage, ["run/c5", "run/c4"]) is None


def test_quarantine_moves_the_checkpoint_aside_with_a_reason(storage: CheckpointStorage) -> None:
    path = saved(storage)
    bad_blob = file_of(storage, path, "pack")
    corrupt(storage, bad_blob, "flip", 50)
    with pytest.raises(CheckpointCorruptError) as info:
        verify(storage, path)
    dst = quarantine(storage, path, str(info.value))
    assert re.fullmatch(r"quarantine/run__c1-\d{8}T\d{12}Z", dst)
    assert not storage.exists(path) and list_dir_checkpoints(storage, "run") == []
    assert storage.read_bytes(f"{dst}/REASON.txt").decode() == (
        f"run/c1: checkpoint run/c1 failed verification (blob {bad_blob}: checksum mismatch)\n"
    )
    # the rotten shared blob went with it, so the next save writes it afresh; the
    # good blobs stay where other checkpoints can use them
    assert not storage.exists(bad_blob)
    assert storage.exists(f"{dst}/blobs/{bad_blob.rsplit('/', 1)[1]}")
    # the same path can be quarantined again without clobbering the first
    saved(storage)
    assert quarantine(storage, path, "again") != dst


def test_list_dir_checkpoints_at_the_root(storage: CheckpointStorage) -> None:
    save(storage, "b", {})
    save(storage, "a", {})
    storage.write_bytes_atomic("notes/x.txt", b"")
    assert list_dir_checkpoints(storage, "") == ["a", "b"]
    assert list_dir_checkpoints(storage, "missing") == []


def test_checkpoint_paths_are_contained(storage: CheckpointStorage) -> None:
    for bad in ("../x", "/abs"):
        with pytest.raises(ValueError, match=r"^storage path "):
            save(storage, bad, {})
        with pytest.raises(ValueError, match=r"^storage path "):
            load(storage, bad)
    with pytest.raises(ValueError, match=r"^checkpoint path is empty"):
        save(storage, "", {})
