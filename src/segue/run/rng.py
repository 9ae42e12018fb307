"""Capture and restore the process-global random number generators as JSON.

A resumed step must continue exactly as if it had never stopped, so every
checkpoint carries Python's ``random`` and, when the step's process imported
them, NumPy's legacy global RNG and torch's CPU and CUDA generators.
``numpy.random.Generator`` objects inside the state tree are handled by the
checkpoint tree codec.

Neither NumPy nor torch is imported to capture: if the process did not import
one, its RNG cannot have been used (a data step's worker never imports NumPy,
and starts 0.15 s sooner for it). A saved NumPy state is restored by importing
NumPy, so a step that imports it later continues from where it was.
"""

from __future__ import annotations

import base64
import random
import sys
import warnings
from typing import Any


def capture() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    out: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
    }
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        out["numpy"] = {
            "name": name,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = {"cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["torch"]["cuda"] = [
                base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()
            ]
    return out


def restore(saved: dict[str, Any]) -> None:
    py = saved.get("python")
    if py is not None:
        random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npst = saved.get("numpy")
    if npst is not None:
        import numpy as np

        np.random.set_state(
            (
                npst["name"],
                np.asarray(npst["keys"], dtype=np.uint32),
                npst["pos"],
                npst["has_gauss"],
                npst["cached_gaussian"],
            )
        )
    th = saved.get("torch")
    if th is not None:
        import numpy as np
        import torch  # the step used torch when this was captured

        def tensor(b64: str) -> Any:
            return torch.from_numpy(np.frombuffer(base64.b64decode(b64), dtype=np.uint8).copy())

        torch.set_rng_state(tensor(th["cpu"]))
        cuda = th.get("cuda")
        if cuda:
            if torch.cuda.is_available() and torch.cuda.device_count() >= len(cuda):
                torch.cuda.set_rng_state_all([tensor(s) for s in cuda])
            else:
                warnings.warn(
                    "checkpoint holds CUDA RNG states but this process has fewer CUDA devices; "
                    "CUDA random streams will differ from an uninterrupted run",
                    RuntimeWarning,
                    stacklevel=2,
                )

