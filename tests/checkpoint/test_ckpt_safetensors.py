"""Our tensor file is a real safetensors file, and the reader trusts none of its header."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import xxhash

from segue.checkpoint.safetensors_io import (
    SafetensorsFormatError,
    pack,
    read_safetensors,
    unpack,
    write_safetensors,
)

ARRAYS = {
    "f64": np.linspace(0, 1, 7),
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f16": np.array([1.5, -2.0], dtype=np.float16),
    "i64": np.array([-(2**62)], dtype=np.int64),
    "i8": np.array([-128, 127], dtype=np.int8),
    "u64": np.array([2**64 - 1], dtype=np.uint64),
    "u8": np.arange(5, dtype=np.uint8),
    "bool": np.array([[True], [False]]),
    "scalar": np.array(3.25, dtype=np.float32),
    "empty": np.zeros((0, 2), dtype=np.int32),
}


def write(arrays: dict[str, np.ndarray], **kw: object) -> bytes:
    buf = io.BytesIO()
    info = write_safetensors(buf, arrays, **kw)  # type: ignore[arg-type]
    data = buf.getvalue()
    assert info.size == len(data)
    assert info.xxh3_128 == xxhash.xxh3_128_hexdigest(data)
    return data


def test_reference_reader_gets_equal_arrays(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    path.write_bytes(write(ARRAYS, metadata={"format": "segue.checkpoint"}))
    got = safetensors.numpy.load_file(str(path))
    assert sorted(got) == sorted(ARRAYS)
    for name, arr in ARRAYS.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, name
        assert np.array_equal(got[name], arr), name


def test_reference_writer_file_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "ref.safetensors"
    safetensors.numpy.save_file(ARRAYS, str(path), metadata={"k": "v"})
    with open(path, "rb") as f:
        result = read_safetensors(f)
    assert result.metadata == {"k": "v"}
    assert result.xxh3_128 == xxhash.xxh3_128_hexdigest(path.read_bytes())
    for name, arr in ARRAYS.items():
        assert result.arrays[name].dtype == arr.dtype and np.array_equal(result.arrays[name], arr)


def test_header_is_padded_to_8_bytes() -> None:
    data = write({"x": np.zeros(1, dtype=np.uint8)})
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0 and data[8 + n - 1 : 8 + n] in (b" ", b"}")


@pytest.mark.parametrize("dtype", ["<c16", ">f8", "<M8[us]", "<U2", "S3"])
def test_pack_unpack_covers_dtypes_safetensors_cannot_name(dtype: str) -> None:
    arr = np.zeros((2, 3), dtype=dtype)
    stored, name = pack(arr)
    got = unpack(read_safetensors(io.BytesIO(write({"a": stored}))).arrays["a"], dtype, (2, 3))
    assert got.dtype == arr.dtype and got.shape == arr.shape and got.tobytes() == arr.tobytes()


def header_file(header: dict[str, object], data: bytes = b"") -> io.BytesIO:
    raw = json.dumps(header).encode()
    return io.BytesIO(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda: io.BytesIO(b"\x01\x00"), r"^file ends inside the header length"),
        (lambda: io.BytesIO(struct.pack("<Q", 2**40)), r"^header length \d+ exceeds"),
        (lambda: io.BytesIO(struct.pack("<Q", 4) + b"{{{{"), r"^header is not JSON"),
        (
            lambda: header_file(
                {"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0"
            ),
            r"^array 'a': unsupported dtype 'X9'$",
        ),
        (
            lambda: header_file(
                {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4
            ),
            r"^array 'a': offsets span 4 bytes, dtype x shape needs 8$",
        ),
        (
            lambda: header_file({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}),
            r"^array 'a': shape and offsets must be ints >= 0$",
        ),
        (
            lambda: header_file(
                {"a": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"\0" * 6
            ),
            r"^array 'a': starts at 2, expected 0 \(gap or overlap\)$",
        ),
        (
            lambda: header_file(
                {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 3
            ),
            r"^file ends inside array 'a'$",
        ),
        (
            lambda: header_file(
                {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0" * 2
            ),
            r"^trailing bytes after the last array$",
        ),
        (lambda: header_file({"__metadata__": {"k": 1}}), r"^__metadata__ must map str to str$"),
    ],
)
def test_reader_rejects_malformed_files(make: object, pattern: str) -> None:
    with pytest.raises(SafetensorsFormatError, match=pattern):
        read_safetensors(make())  # type: ignore[operator]
