"""Content-addressed blobs (format v2): plan them, stage them, hash them.

An encoded state becomes a few blobs: every large array its own safetensors file
(one tensor, data page-aligned), the small arrays packed into safetensors files of
at most :data:`PACK_BYTES`, and pickled values (only with allow_pickle) in one raw
file. A blob's name is the xxh3_128 of its bytes, so an array that did not change
since the last checkpoint has a name that already exists and is not written again.

This module never writes: :mod:`.writer` does. It must never hold a reference to
the caller's arrays once :func:`stage` has copied them.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import xxhash

from .._lazy import numpy_on_first_use
from .format import ArrayEntry, OpaqueEntry
from .jobs import run_all
from .safetensors_io import header_bytes, pack
from .tree import Encoded

if TYPE_CHECKING:
    import numpy as np
else:
    np = numpy_on_first_use(globals())  # only array states need it: see segue._lazy

BLOB_DIR = "blobs"
PENDING_DIR = f"{BLOB_DIR}/pending"
LARGE_BYTES = 1 << 20
"""Arrays at least this big get a blob of their own; smaller ones are packed."""
PACK_BYTES = 64 << 20
"""A pack of small arrays is closed once it holds this many bytes."""
ALIGN = 4096
"""Blob data starts at a multiple of this, so writes and reads are page-aligned."""
CHUNK = 8 << 20
"""Unit of parallel copy, hash and write work."""
META = {"format": "segue.checkpoint"}


@dataclass(eq=False)  # identity: plans hold arrays, which do not compare to a bool
class BlobPlan:
    """One blob: its header, its data segments (written back to back) and what it holds."""

    kind: str  # "array" | "pack" | "opaque" | "file" (a scratch file's bytes: .scratch)
    header: bytes
    segments: list[np.ndarray]  # 1-d uint8, C-contiguous
    arrays: dict[str, ArrayEntry] = field(default_factory=dict)  # ref -> entry (file unset)
    opaque: dict[str, OpaqueEntry] = field(default_factory=dict)
    key: str = ""

    @property
    def size(self) -> int:
        return len(self.header) + sum(s.nbytes for s in self.segments)

    @property
    def path(self) -> str:
        if not self.key:
            raise ValueError("blob is not hashed yet")
        ext = ".bin" if self.kind in ("opaque", "file") else ".safetensors"
        return blob_path(self.key, ext)

    def join_segments(self) -> None:
        """Copy the segments into one buffer when there are several (a pack of small
        arrays not staged yet): one hash update and one write each, not thousands."""
        if len(self.segments) > 1:
            self.segments = [np.concatenate(self.segments)]

    def chunks(self) -> Iterator[tuple[int, memoryview]]:
        """(offset, bytes) pieces of at most CHUNK that make up the blob."""
        yield 0, memoryview(self.header)
        offset = len(self.header)
        for seg in self.segments:
            data = memoryview(seg)  # type: ignore[arg-type]  # ndarray implements the buffer protocol
            for start in range(0, len(data), CHUNK):
                piece = data[start : start + CHUNK]
                yield offset + start, piece
            offset += len(data)


    def batches(self) -> list[list[tuple[int, memoryview]]]:
        """:meth:`chunks` grouped into jobs of about CHUNK bytes (small pieces share a job)."""
        out: list[list[tuple[int, memoryview]]] = []
        cur: list[tuple[int, memoryview]] = []
        cur_bytes = 0
        for off, piece in self.chunks():
            cur.append((off, piece))
            cur_bytes += len(piece)
            if cur_bytes >= CHUNK:
                out.append(cur)
                cur, cur_bytes = [], 0
        if cur:
            out.append(cur)
        return out


def blob_path(key: str, ext: str) -> str:
    return f"{BLOB_DIR}/{key[:2]}/{key}{ext}"


def _flat(arr: np.ndarray) -> np.ndarray:
    return arr.reshape(-1).view(np.uint8)


def _stored(ref: str, arr: np.ndarray, meta: dict[str, Any]) -> tuple[np.ndarray, str]:
    stored, st = pack(arr)
    if meta.get("dtype") == "bfloat16":  # uint16 bits: name them BF16 for other readers
        st = "BF16"
    return stored, st


_Template = list[tuple[str, bytes, dict[str, ArrayEntry], list[str]]]
_last_layout: tuple[Any, _Template] | None = None
"""The array blobs of the last plan, by layout (:attr:`.tree.Encoded.layout`): a
checkpointer saves the same structure again and again, and rebuilding thousands of
small arrays' headers and entries each time cost more than copying their bytes."""


def plan(enc: Encoded, *, large_bytes: int = LARGE_BYTES) -> list[BlobPlan]:
    """Group the arrays and opaque values of ``enc`` into blobs (nothing is copied)."""
    global _last_layout
    plans: list[BlobPlan]
    key = (large_bytes, tuple(enc.layout)) if len(enc.layout) == len(enc.arrays) else None
    last = _last_layout  # one read: another thread may replace it, never mutate it
    if not enc.arrays:
        plans = []  # a state of JSON only (a data step's): NumPy is never needed
    elif key is not None and last is not None and last[0] == key:
        arrs = enc.arrays
        # The encoder made every array C-contiguous; only big-endian ones need pack(),
        # and datetimes cannot export a buffer to np.frombuffer.
        if any(d.byteorder == ">" or d.kind in "mM" for d, _, _ in enc.layout):
            plans = [BlobPlan(kind, head, [_flat(pack(arrs[r])[0]) for r in refs],
                              arrays=dict(entries)) for kind, head, entries, refs in last[1]]
        else:
            as_bytes = np.frombuffer  # of a C-contiguous array: _flat's bytes, in one call
            plans = [BlobPlan(kind, head, [as_bytes(arrs[r], np.uint8) for r in refs],
                              arrays=dict(entries)) for kind, head, entries, refs in last[1]]
    else:
        plans = _plan_arrays(enc, large_bytes)
        if key is not None:
            _last_layout = (key, [(p.kind, p.header, dict(p.arrays), list(p.arrays)) for p in plans])
    if enc.opaque:
        segs, entries, offset = [], {}, 0
        for ref, blob in enc.opaque.items():
            segs.append(np.frombuffer(blob, dtype=np.uint8))
            entries[ref] = OpaqueEntry("", offset, len(blob), enc.opaque_types[ref])
            offset += len(blob)
        plans.append(BlobPlan("opaque", b"", segs, opaque=entries))
    return plans


def _plan_arrays(enc: Encoded, large_bytes: int) -> list[BlobPlan]:
    plans: list[BlobPlan] = []
    small: list[tuple[str, np.ndarray, str]] = []
    small_bytes = 0

    def close_pack() -> None:
        nonlocal small, small_bytes
        if not small:
            return
        arrays = {ref: a for ref, a, _ in small}
        dtypes = {ref: st for ref, _, st in small}
        head = header_bytes(arrays, dtypes=dtypes, metadata=META, align=ALIGN)
        entries = {
            ref: ArrayEntry("", enc.arrays[ref].dtype.str, tuple(enc.arrays[ref].shape), st,
                            enc.array_meta[ref], name=ref)
            for ref, _, st in small
        }
        plans.append(BlobPlan("pack", head, [_flat(a) for _, a, _ in small], arrays=entries))
        small, small_bytes = [], 0

    for ref, arr in enc.arrays.items():
        meta = enc.array_meta[ref]
        stored, st = _stored(ref, arr, meta)
        if stored.nbytes >= large_bytes:
            head = header_bytes({"data": stored}, dtypes={"data": st}, metadata=META, align=ALIGN)
            entry = ArrayEntry("", arr.dtype.str, tuple(arr.shape), st, meta, name="data")
            plans.append(BlobPlan("array", head, [_flat(stored)], arrays={ref: entry}))
            continue
        small.append((ref, stored, st))
        small_bytes += stored.nbytes
        if small_bytes >= PACK_BYTES:
            close_pack()
    close_pack()
    return plans


class Arena:
    """A reusable host buffer that staged blobs are copied into.

    Grown when a save needs more, never shrunk: steady-state saves allocate nothing.
    """

    def __init__(self) -> None:
        self.buf: np.ndarray | None = None  # made at the first save with bytes to copy

    def reserve(self, nbytes: int) -> np.ndarray:
        if self.buf is None or self.buf.nbytes < nbytes:
            self.buf = np.empty(nbytes, dtype=np.uint8)
            self.buf.fill(0)  # fault the pages in now, not during the timed copy
        return self.buf[:nbytes]


def stage(plans: list[BlobPlan], arena: Arena, pool: Executor | None) -> list[BlobPlan]:
    """Copy every segment into ``arena`` (in parallel chunks); return plans that use it.

    After this returns the caller may change or free its arrays.
    """
    total = sum(s.nbytes for p in plans for s in p.segments)
    if not total:
        return plans  # nothing to copy (a state of JSON only)
    buf = arena.reserve(total)
    jobs: list[list[tuple[np.ndarray, Any]]] = [[]]
    job_bytes = 0
    out: list[BlobPlan] = []
    offset = 0
    for p in plans:
        if p.kind == "pack" and len(p.segments) > 1:
            # A pack becomes one contiguous segment, copied by one np.concatenate:
            # no Python work per small array.
            n = sum(s.nbytes for s in p.segments)
            dst = buf[offset : offset + n]
            jobs[-1].append((dst, p.segments))
            job_bytes += n
            if job_bytes >= CHUNK:
                jobs.append([])
                job_bytes = 0
            offset += n
            out.append(replace(p, segments=[dst]))
            continue
        segs = []
        for s in p.segments:
            dst = buf[offset : offset + s.nbytes]
            for start in range(0, s.nbytes, CHUNK):
                piece = s[start : start + CHUNK]
                jobs[-1].append((dst[start : start + CHUNK], piece))
                job_bytes += piece.nbytes
                if job_bytes >= CHUNK:  # small arrays share a job: no per-array dispatch
                    jobs.append([])
                    job_bytes = 0
            segs.append(dst)
            offset += s.nbytes
        # A pack becomes one contiguous segment: it is written as one piece later.
        if p.kind == "pack" and segs:
            segs = [buf[offset - sum(x.nbytes for x in segs) : offset]]
        out.append(replace(p, segments=segs))

    def copy(job: list[tuple[np.ndarray, Any]]) -> None:
        for dst, src in job:
            if type(src) is list:
                np.concatenate(src, out=dst)
            else:
                np.copyto(dst, src)

    # np.copyto releases the GIL: the copies run in parallel. run_all returns only
    # once every copy has ended, so none writes into an arena handed back on failure.
    run_all(pool, copy, jobs)
    return out


def hash_blob(p: BlobPlan) -> str:
    hasher = xxhash.xxh3_128()
    for _, piece in p.chunks():
        hasher.update(piece)
    return hasher.hexdigest()
