"""torch tensors to host numpy arrays and back, without importing torch eagerly.

A value can only be a tensor if the caller already imported torch, so encoding
looks in ``sys.modules`` and never pays torch's import cost. bfloat16 has no numpy
dtype: its bits travel as uint16 and the torch dtype is recorded in the meta.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any

from .._lazy import numpy_on_first_use
from ..errors import CheckpointError

if TYPE_CHECKING:
    import numpy as np
else:
    np = numpy_on_first_use(globals())  # only array states need it: see segue._lazy


def is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


class _PinnedPool:
    """Reused page-locked host buffers for device-to-host copies.

    A copy from a GPU into pageable memory goes through a bounce buffer and is
    many times slower than DMA into pinned memory, and pinning is itself slow,
    so the buffers are allocated once and reused by every later save (like the
    writer's arena). Buffers are handed out in order within one encode; the
    caller copies out of them before the next encode starts.
    """

    def __init__(self) -> None:
        self.free: dict[tuple[Any, ...], list[Any]] = {}
        self.used: dict[tuple[Any, ...], int] = {}

    def begin(self) -> None:
        self.used.clear()

    def take(self, t: Any) -> Any:
        import torch  # type: ignore[import-not-found, unused-ignore]

        key = (tuple(t.shape), t.dtype)
        bufs = self.free.setdefault(key, [])
        i = self.used.get(key, 0)
        self.used[key] = i + 1
        if i == len(bufs):
            bufs.append(torch.empty(t.shape, dtype=t.dtype, pin_memory=True))
        return bufs[i]


_pinned = _PinnedPool()


def begin_encode() -> None:
    """Called at the start of each encode: pinned buffers may be reused from here."""
    _pinned.begin()


def _to_host(t: Any) -> Any:
    t = t.detach()
    if t.is_cuda:
        host = _pinned.take(t)
        host.copy_(t)  # DMA into page-locked memory; synchronous, so the data is there
        return host
    return t.to("cpu").contiguous()


def to_numpy(t: Any) -> tuple[np.ndarray, dict[str, Any]] | None:
    """A host copy of ``t`` and its meta, or None if numpy cannot hold its dtype.

    For a CUDA tensor the copy lives in a reused pinned buffer: the caller must
    copy it out before the next encode (the writer's staging does).
    """
    import torch  # type: ignore[import-not-found, unused-ignore]

    dtype = str(t.dtype).removeprefix("torch.")
    meta = {"framework": "torch", "dtype": dtype, "device": str(t.device)}
    host = _to_host(t)
    if t.dtype == torch.bfloat16:
        return host.view(torch.int16).numpy().view(np.uint16), meta
    try:
        return host.numpy(), meta
    except TypeError:  # float8, complex32, ...: numpy has no such dtype
        return None


def from_numpy(arr: np.ndarray, meta: dict[str, Any]) -> Any:
    """Rebuild the tensor on its device, or on the CPU with a warning if that is gone."""
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise CheckpointError(
            "this checkpoint holds torch tensors; install torch to load it"
        ) from None
    if meta.get("dtype") == "bfloat16":
        t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(arr)
    device = str(meta.get("device", "cpu"))
    if device == "cpu":
        return t
    if device.startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(
            f"tensor was saved on {device} but CUDA is unavailable; loaded it on the cpu",
            RuntimeWarning,
            stacklevel=4,
        )
        return t
    try:
        return t.to(device)
    except (RuntimeError, AssertionError) as e:  # e.g. cuda:3 on a 1-GPU machine
        warnings.warn(
            f"tensor was saved on {device} but cannot be placed there ({e}); loaded it on the cpu",
            RuntimeWarning,
            stacklevel=4,
        )
        return t
