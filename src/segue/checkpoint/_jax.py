"""JAX arrays to host numpy arrays and back, without importing JAX eagerly.

As with torch, a value can only be a JAX array if the caller imported JAX.
bfloat16 (an ml_dtypes dtype numpy cannot name in a file) travels as uint16
bits; the real dtype is in the meta. Arrays come back on the device they were
saved from when it exists, else on JAX's default device with a warning.
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


def is_array(value: Any) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.Array)


def to_numpy(a: Any) -> tuple[np.ndarray, dict[str, Any]] | None:
    devices = sorted(str(d) for d in a.devices()) if hasattr(a, "devices") else []
    if len(devices) > 1:
        return None  # sharded arrays: not supported yet; the caller refuses with a clear error
    host = np.asarray(a)  # blocks until the device-to-host copy is done
    dtype = str(a.dtype)
    meta = {"framework": "jax", "dtype": dtype, "device": devices[0] if devices else "cpu"}
    if dtype == "bfloat16":
        return np.ascontiguousarray(host).view(np.uint16), meta
    if host.dtype.kind == "V":
        return None
    return np.ascontiguousarray(host), meta


def from_numpy(arr: np.ndarray, meta: dict[str, Any]) -> Any:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        raise CheckpointError("this checkpoint holds JAX arrays; install jax to load it") from None
    if meta.get("dtype") == "bfloat16":
        arr = arr.view(jnp.bfloat16)
    want = str(meta.get("device", ""))
    for d in jax.devices() + jax.devices("cpu"):
        if str(d) == want:
            return jax.device_put(arr, d)
    warnings.warn(f"array was saved on {want} but that device is not here; "
                  f"loaded it on {jax.devices()[0]}", RuntimeWarning, stacklevel=4)
    return jnp.asarray(arr)
