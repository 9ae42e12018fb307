"""State trees round-trip exactly through save/load; what cannot be stored is refused."""

from __future__ import annotations

import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import assert_same
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from segue.checkpoint import CheckpointStorage, LocalStorage, load, read_manifest, save
from segue.checkpoint.tree import TAG, decode, encode
from segue.errors import StateTypeError


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    """Encoding tests need one backend; the storage contract runs the others."""
    return LocalStorage(tmp_path / "root")


DTYPES = [
    "<f8",
    "<f4",
    "<f2",
    "<i8",
    "<i4",
    "<i2",
    "i1",
    "<u8",
    "<u4",
    "<u2",
    "u1",
    "?",
    "<c8",
    "<c16",
    ">f8",
    ">i4",
    "<M8[s]",
    "<m8[ms]",
    "<U3",
    "S4",
]

arrays = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(
        np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
    )
)
np_scalars = (
    st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(np.dtype(dt), ())).map(lambda a: a[()])
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**64, max_value=2**200)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
keys = st.text(max_size=6).filter(lambda k: k != TAG)
trees = st.recursive(
    scalars | arrays | np_scalars,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.lists(kids, max_size=4).map(tuple)
        | st.dictionaries(keys, kids, max_size=4)
    ),
    max_leaves=12,
)


def roundtrip(state: Any, **kw: Any) -> Any:
    enc = encode(state, **kw)
    return decode(enc.tree, enc.arrays, enc.array_meta, enc.opaque, **kw)


@settings(max_examples=150, deadline=None)
@given(trees)
def test_encode_decode_roundtrip_is_exact(state: Any) -> None:
    assert_same(state, roundtrip(state))


@settings(max_examples=40, deadline=None)
@given(trees)
def test_save_load_roundtrip_is_exact(state: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        storage = LocalStorage(d)
        save(storage, "c", state)
        assert_same(state, load(storage, "c").state)


def test_every_supported_type_roundtrips_through_disk(storage: CheckpointStorage) -> None:
    state = {
        "none": None,
        "t": True,
        "f": False,
        "int": -7,
        "big": -(2**130),
        "float": 0.1,
        "nan": float("nan"),
        "inf": float("inf"),
        "-inf": float("-inf"),
        "-0": -0.0,
        "str": "héllo",
        "bytes": b"\x00\xff",
        "tuple": (1, (2, [3])),
        "empty": ((), [], {}),
        "odict": OrderedDict(b=1, a=2),
        "order": {"z": 1, "a": 2},
        "f32": np.float32(1.5),
        "i8": np.int8(-3),
        "bool_": np.bool_(True),
        "a0d": np.array(2.5),
        "bool": np.array([True, False]),
        "empty_arr": np.zeros((0, 3)),
        "fortran": np.asfortranarray(np.arange(6).reshape(2, 3)),
        "strided": np.arange(10)[::3],
        "c128": np.array([1 + 2j]),
    }
    got = load(storage, save(storage, "c", state).path).state
    assert_same(state, got)
    assert type(got["odict"]) is OrderedDict


def test_many_small_arrays_share_one_file(storage: CheckpointStorage) -> None:
    state = {f"p{i}": np.full(3, i, dtype=np.float32) for i in range(2000)}
    result = save(storage, "c", state)
    assert len(result.files) == 1 and next(iter(result.files)).endswith(".safetensors")
    assert_same(state, load(storage, "c").state)


@pytest.mark.parametrize("kind", ["PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"])
def test_generator_draws_continue_identically(storage: CheckpointStorage, kind: str) -> None:
    gen = np.random.Generator(getattr(np.random, kind)(1234))
    gen.random(5)  # advance past the seed state
    save(storage, "c", {"rng": gen})
    restored = load(storage, "c").state["rng"]
    assert type(restored.bit_generator).__name__ == kind
    assert np.array_equal(restored.random(100), gen.random(100))
    assert np.array_equal(restored.integers(0, 1 << 40, 10), gen.integers(0, 1 << 40, 10))


class Foo:
    pass


FIX = (
    r"checkpoints store dicts, lists, tuples, scalars, strings, bytes and arrays; "
    r"convert it, or pass allow_pickle=True to save and load$"
)


@pytest.mark.parametrize(
    ("state", "pattern"),
    [
        ({"a": [{1, 2}]}, r"^state\['a'\]\[0\] holds a set; " + FIX),
        ({"model": {"opt": Foo()}}, r"^state\['model'\]\['opt'\] holds a [\w.]*Foo; " + FIX),
        (
            {"d": {"a": "x", 1: "x"}},  # all-int keys are fine (idict); mixed are not
            r"^state\['d'\] has a key of type int \(1\); checkpoint dicts need "
            r"str keys; " + FIX,
        ),
        (
            {"d": {TAG: 1}},
            r"^state\['d'\] has the key '__segue__', which segue reserves; "
            r"rename it; " + FIX,
        ),
        ((np.array([object()]),), r"^state\[0\] holds an array of dtype object; " + FIX),
        ([1j], r"^state\[0\] holds a complex; " + FIX),
    ],
)
def test_unstorable_values_are_refused_with_their_path(state: Any, pattern: str) -> None:
    with pytest.raises(StateTypeError, match=pattern):
        encode(state)


def test_refused_state_writes_nothing(storage: CheckpointStorage) -> None:
    with pytest.raises(StateTypeError):
        save(storage, "c", {"x": {1, 2}})
    assert storage.listdir("") == []


def test_pickle_needs_opt_in_on_save_and_on_load(storage: CheckpointStorage) -> None:
    state = {"x": {1, 2}, "y": Foo, "z": np.arange(3)}
    with pytest.raises(StateTypeError, match=r"^state\['x'\] holds a set; "):
        save(storage, "c", state)
    save(storage, "c", state, allow_pickle=True)
    assert storage.listdir("c") == ["MANIFEST.json"]  # data lives in shared blobs
    files = read_manifest(storage, "c").files
    assert sorted(f.rsplit(".", 1)[1] for f in files) == ["bin", "safetensors"]
    with pytest.raises(
        StateTypeError,
        match=r"^state\['x'\] was saved with pickle; loading it runs code from the checkpoint, "
        r"so pass allow_pickle=True to load if you trust its source$",
    ):
        load(storage, "c")
    got = load(storage, "c", allow_pickle=True).state
    assert got["x"] == {1, 2} and got["y"] is Foo
    assert_same(state["z"], got["z"])


def test_torch_tensor_is_not_mistaken_without_torch() -> None:
    # Without torch imported, an unknown object is refused, never probed by importing torch.
    with pytest.raises(StateTypeError, match=r"^state holds a [\w.]*Foo; "):
        encode(Foo())


def test_int_keyed_dicts_roundtrip(storage: CheckpointStorage) -> None:
    state = {"opt_state": {0: {"step": np.float32(3)}, 5: {"m": np.zeros(2)}}, "e": {}}
    assert_same(state, load(storage, save(storage, "c", state).path).state)
