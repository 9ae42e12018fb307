"""Capture and restore the process-global random number generators as JSON.

A resumed step must continue exactly as if it had never stopped, so every
checkpoint carries Python's ``random``, NumPy's legacy global RNG and, when the
step imported torch, torch's CPU and CUDA generators. ``numpy.random.Generator``
objects inside the state tree are handled by the checkpoint tree codec.

torch is never imported here: if the step did not import it, its RNG cannot
have been used.
"""

from __future__ import annotations

import base64
import random
import sys
import warnings
from typing import Any

import numpy as np


def capture() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    out: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "name": name,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
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
