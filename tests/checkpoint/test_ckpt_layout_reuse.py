"""The plan of a state's blobs is reused when the next save has the same layout.

A checkpointer saves the same structure again and again; ``blobs.plan`` keeps
the last layout's headers and entries so thousands of small arrays cost no
Python work per save. Reuse must never change a byte: every plan made from the
cache equals a fresh one, and a layout that differs in any way (a shape, a
dtype, a byte order, a tensor's metadata) is planned afresh.
"""

from __future__ import annotations

import numpy as np
import pytest

from segue.checkpoint import LocalStorage, blobs, load, save
from segue.checkpoint.tree import encode
from segue.errors import StateTypeError


def _state(seed: int, small_shape: tuple[int, ...] = (64,)) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "big": rng.random(300_000, dtype=np.float32),  # >= 1 MiB: a blob of its own
        "small": {f"b{i}": rng.random(small_shape, dtype=np.float32) for i in range(300)},
        "be": np.arange(7, dtype=">i4") * seed,
        "when": np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[D]") + seed,
        "zero_d": np.array(seed * 1.5),
        "step": seed,
    }


def _fresh_plan(enc: blobs.Encoded) -> list[blobs.BlobPlan]:
    saved = blobs._last_layout
    blobs._last_layout = None
    try:
        return blobs.plan(enc)
    finally:
        blobs._last_layout = saved


def _bytes(plans: list[blobs.BlobPlan]) -> list[tuple[str, bytes, bytes, dict]]:
    return [(p.kind, p.header, b"".join(bytes(s) for s in p.segments), p.arrays) for p in plans]


def test_a_reused_plan_equals_a_fresh_one_byte_for_byte() -> None:
    blobs.plan(encode(_state(1)))  # primes the cache with this layout
    enc = encode(_state(2))  # same layout, other content
    assert blobs._last_layout is not None and blobs._last_layout[0][1] == tuple(enc.layout)
    assert _bytes(blobs.plan(enc)) == _bytes(_fresh_plan(enc))


def test_a_changed_layout_is_planned_afresh() -> None:
    blobs.plan(encode(_state(1)))
    enc = encode(_state(2, small_shape=(8, 8)))  # same bytes per array, other shape
    got = blobs.plan(enc)
    assert _bytes(got) == _bytes(_fresh_plan(enc))
    shapes = {e.shape for p in got for e in p.arrays.values()}
    assert (8, 8) in shapes and (64,) not in shapes


def test_saves_that_reuse_the_plan_round_trip_exactly(tmp_path) -> None:
    storage = LocalStorage(tmp_path)
    states = [_state(1), _state(2), _state(3, small_shape=(4, 16)), _state(4)]
    for i, st in enumerate(states):
        save(storage, f"c{i}", st)
    for i, st in enumerate(states):
        back = load(storage, f"c{i}").state
        assert back["step"] == st["step"]
        for key in ("big", "be", "when", "zero_d"):
            assert back[key].dtype == st[key].dtype and back[key].shape == st[key].shape
            assert np.array_equal(back[key], st[key])
        for k, v in st["small"].items():
            assert back["small"][k].shape == v.shape and np.array_equal(back["small"][k], v)


def test_errors_still_name_the_place_in_the_tree() -> None:
    with pytest.raises(StateTypeError, match=r"state\['a'\]\['b'\]\[1\] holds a object"):
        encode({"a": {"b": [1, object()]}})
    with pytest.raises(StateTypeError, match=r"state\['t'\]\[0\]\[2\] holds a set"):
        encode({"t": ((1, 2, {3}),)})
