"""Many arrays in one safetensors file: a streaming writer and a validating reader.

Layout (the safetensors format): an 8-byte little-endian header length N, N bytes
of JSON header (padded with spaces to 8-byte alignment) mapping each name to
``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), an
optional ``__metadata__`` map of str to str, then the raw little-endian bytes.

The writer streams: it never builds the file in memory, and hashes (xxh3_128) what
it writes. The reader reads strictly front to back, so it can hash the whole file in
the same pass, and copies every array out so the file can be closed or moved.
It never unpickles and never trusts the header: every offset and size is checked.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import xxhash

from .._lazy import numpy_on_first_use
from ..errors import CheckpointFormatError

if TYPE_CHECKING:
    import numpy as np
else:
    np = numpy_on_first_use(globals())  # only array states need it: see segue._lazy

CHUNK = 16 << 20
"""Bytes per write/read call: large enough to be fast, small enough to bound memory."""

MAX_HEADER = 100 << 20
"""The reference implementation refuses headers over 100 MB; so do we."""

# safetensors name -> numpy dtype (little-endian). BF16 has no numpy dtype: it is
# carried as uint16 and only named BF16 in the header.
_ST_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "C64": "<c8",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}


@functools.cache
def st_to_np() -> dict[str, np.dtype]:
    return {name: np.dtype(code) for name, code in _ST_DTYPES.items()}


@functools.cache
def np_to_st() -> dict[np.dtype, str]:
    return {dt: name for name, dt in st_to_np().items() if name != "BF16"}


class SafetensorsFormatError(CheckpointFormatError):
    """The bytes are not a well-formed safetensors file."""


@dataclass(frozen=True)
class WriteInfo:
    size: int
    xxh3_128: str


@dataclass(frozen=True)
class ReadResult:
    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]
    metadata: dict[str, str]
    size: int
    xxh3_128: str


def pack(arr: np.ndarray) -> tuple[np.ndarray, str]:
    """A C-contiguous little-endian view of ``arr`` and its safetensors dtype name.

    dtypes safetensors cannot name (complex128, datetime, str, ...) are stored as
    their raw bytes (U8, 1-d); the caller records the real dtype and shape and
    rebuilds the array with :func:`unpack`.
    """
    dt = arr.dtype
    if dt.hasobject or dt.kind == "V":
        raise ValueError(f"dtype {dt} has no raw-byte form")
    if dt.byteorder == ">":
        arr = arr.astype(dt.newbyteorder("<"))
        dt = arr.dtype
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    name = np_to_st().get(dt)
    if name is not None:
        return arr, name
    return arr.reshape(-1).view(np.uint8), "U8"


def unpack(stored: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Invert :func:`pack`: rebuild an array of numpy ``dtype`` (a ``dtype.str``) and ``shape``."""
    dt = np.dtype(dtype)
    if stored.dtype != dt:
        if stored.dtype == np.uint8 and stored.ndim == 1:
            stored = stored.view(dt.newbyteorder("<") if dt.byteorder == ">" else dt)
        stored = stored.astype(dt, copy=False)
    return stored.reshape(shape)


def _header(
    arrays: Mapping[str, np.ndarray],
    dtypes: Mapping[str, str],
    metadata: Mapping[str, str] | None,
    align: int = 8,
) -> bytes:
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, arr in arrays.items():
        if name == "__metadata__":
            raise ValueError("array name '__metadata__' is reserved by safetensors; rename it")
        st = dtypes.get(name) or np_to_st().get(arr.dtype)
        if st is None or st_to_np()[st].itemsize != arr.dtype.itemsize:
            raise ValueError(
                f"array {name!r}: dtype {arr.dtype} has no safetensors name; pack() it"
            )
        if arr.dtype.byteorder == ">" or not arr.flags.c_contiguous:
            raise ValueError(f"array {name!r} must be C-contiguous little-endian; pack() it")
        header[name] = {
            "dtype": st,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    # Pad so the data starts 8-byte aligned (as the reference writer does), which lets
    # a reader map arrays in place without misaligned loads; blobs align to a page so
    # their data can be written and read in page-aligned chunks.
    raw += b" " * (-(8 + len(raw)) % align)
    return struct.pack("<Q", len(raw)) + raw


def header_bytes(
    arrays: Mapping[str, np.ndarray],
    *,
    dtypes: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
    align: int = 8,
) -> bytes:
    """The header (length prefix included) of a file holding ``arrays`` back to back.

    The data of the first array starts at ``len(result)``, a multiple of ``align``.
    """
    return _header(arrays, dtypes or {}, metadata, align)


def write_safetensors(
    f: BinaryIO,
    arrays: Mapping[str, np.ndarray],
    *,
    dtypes: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> WriteInfo:
    """Stream ``arrays`` (C-contiguous, little-endian) into ``f``; return size and hash.

    ``dtypes`` overrides the header dtype name per array (e.g. ``"BF16"`` for
    bfloat16 bits carried as uint16); the item sizes must agree.
    """
    hasher = xxhash.xxh3_128()
    head = _header(arrays, dtypes or {}, metadata)
    f.write(head)
    hasher.update(head)
    size = len(head)
    for arr in arrays.values():
        flat = arr.reshape(-1).view(np.uint8).data
        for start in range(0, len(flat), CHUNK):
            chunk = flat[start : start + CHUNK]
            f.write(chunk)
            hasher.update(chunk)
        size += len(flat)
    return WriteInfo(size=size, xxh3_128=hasher.hexdigest())


def _read_exact(f: BinaryIO, n: int, hasher: xxhash.xxh3_128, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise SafetensorsFormatError(f"file ends inside the {what} ({len(data)} of {n} bytes)")
    hasher.update(data)
    return data


def _readinto_exact(f: BinaryIO, buf: memoryview, name: str) -> None:
    # Raw and remote file objects may return short reads; loop until full or EOF.
    filled = 0
    while filled < len(buf):
        got = f.readinto(buf[filled:])  # type: ignore[attr-defined]
        if not got:
            raise SafetensorsFormatError(f"file ends inside array {name!r}")
        filled += got


def _parse_header(
    raw: bytes,
) -> tuple[dict[str, str], list[tuple[str, str, tuple[int, ...], int, int]]]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsFormatError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsFormatError("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise SafetensorsFormatError("__metadata__ must map str to str")
    entries = []
    for name, entry in header.items():
        try:
            st, shape = entry["dtype"], tuple(entry["shape"])
            begin, end = entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise SafetensorsFormatError(f"array {name!r}: malformed header entry") from None
        if st not in _ST_DTYPES:
            raise SafetensorsFormatError(f"array {name!r}: unsupported dtype {st!r}")
        if not all(type(d) is int and d >= 0 for d in (*shape, begin, end)):
            raise SafetensorsFormatError(f"array {name!r}: shape and offsets must be ints >= 0")
        nbytes = math.prod(shape) * st_to_np()[st].itemsize
        if end - begin != nbytes:
            raise SafetensorsFormatError(
                f"array {name!r}: offsets span {end - begin} bytes, dtype x shape needs {nbytes}"
            )
        entries.append((name, st, shape, begin, end))
    entries.sort(key=lambda t: (t[3], t[4]))
    return metadata, entries


def read_safetensors(f: BinaryIO) -> ReadResult:
    """Read every array of a safetensors file front to back, hashing the whole file.

    Arrays are fresh copies owned by the caller. The data region must be exactly
    tiled by the arrays (no gaps, overlaps or trailing bytes), as the format requires.
    """
    hasher = xxhash.xxh3_128()
    (n,) = struct.unpack("<Q", _read_exact(f, 8, hasher, "header length"))
    if n > MAX_HEADER:
        raise SafetensorsFormatError(f"header length {n} exceeds {MAX_HEADER}")
    metadata, entries = _parse_header(_read_exact(f, n, hasher, "header"))
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    pos = 0
    for name, st, shape, begin, end in entries:
        if begin != pos:
            raise SafetensorsFormatError(
                f"array {name!r}: starts at {begin}, expected {pos} (gap or overlap)"
            )
        arr = np.empty(shape, dtype=st_to_np()[st])
        flat = arr.reshape(-1).view(np.uint8).data
        for start in range(0, end - begin, CHUNK):
            chunk = flat[start : start + CHUNK]
            _readinto_exact(f, chunk, name)
            hasher.update(chunk)
        arrays[name], dtypes[name] = arr, st
        pos = end
    if f.read(1):
        raise SafetensorsFormatError("trailing bytes after the last array")
    return ReadResult(arrays, dtypes, metadata, size=8 + n + pos, xxh3_128=hasher.hexdigest())
