"""Model memory profiles: what ``segue bench-model`` measured, kept in the home.

A profile is one JSON file per handler (name and version) and device type::

    HOME/profiles/NAME@VERSION/DEVICE_TYPE.json

It holds the load time and memory, and per batch size the peak memory,
latencies and throughput (the format is documented in docs/inference.md and
checked by :func:`check_profile`). A step whose handler declares
``batch_size="auto"`` takes the profile's recommended batch; the planner fits
peak = base + slope * batch from it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .._atomic import write_atomic
from ..errors import UsageError

PROFILE_VERSION = 1
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def profile_path(home: str | os.PathLike[str], name: str, version: str, device_type: str) -> Path:
    """Where the profile of handler ``name@version`` on ``device_type`` lives (names made path-safe)."""
    def safe(s: str) -> str:
        return _SAFE.sub("_", s)[:128] or "_"
    return Path(home) / "profiles" / f"{safe(name)}@{safe(version)}" / f"{safe(device_type)}.json"


def check_profile(profile: Any, where: str = "profile") -> dict[str, Any]:
    """``profile`` if it is a valid version-1 profile, else a one-line UsageError."""
    if not isinstance(profile, dict):
        raise UsageError(f"{where} is not a JSON object; write it with `segue bench-model`")
    if profile.get("v") != PROFILE_VERSION:
        raise UsageError(f"{where} has version {profile.get('v')!r}, not {PROFILE_VERSION}; "
                         f"measure again with `segue bench-model`")
    batches = profile.get("batches")
    if not isinstance(batches, list) or not batches:
        raise UsageError(f"{where} has no measured batches; measure again with `segue bench-model`")
    for b in batches:
        if not (isinstance(b, dict) and isinstance(b.get("batch_size"), int) and b["batch_size"] > 0
                and isinstance(b.get("peak_bytes"), int | float)):
            raise UsageError(f"{where}: each batch needs a positive int batch_size and peak_bytes, not {b!r}")
    rec = profile.get("recommended_batch_size")
    if rec is not None and not (isinstance(rec, int) and rec > 0):
        raise UsageError(f"{where}: recommended_batch_size must be a positive int, not {rec!r}")
    return profile


def save_profile(home: str | os.PathLike[str], profile: dict[str, Any]) -> Path:
    """Write ``profile`` atomically to its place in ``home``; returns the path."""
    check_profile(profile)
    path = profile_path(home, profile["handler"], str(profile["version"]), profile["device_type"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(profile, indent=2, sort_keys=True) + "\n").encode())
    return path


def load_profile(home: str | os.PathLike[str], name: str, version: str, device_type: str
                 ) -> dict[str, Any] | None:
    """The stored profile, or None if there is none; a corrupt one is a one-line UsageError."""
    path = profile_path(home, name, version, device_type)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"profile {path} is not valid JSON ({exc}); delete it and run `segue bench-model` "
                         f"again") from None
    return check_profile(data, f"profile {path}")


def recommended_batch(home: str | os.PathLike[str], name: str, version: str, device_type: str) -> int:
    """The batch size ``segue bench-model`` recommended, for ``batch_size="auto"``."""
    profile = load_profile(home, name, version, device_type)
    if profile is None or not profile.get("recommended_batch_size"):
        where = profile_path(home, name, version, device_type)
        raise UsageError(
            f"handler {name!r} asks for batch_size='auto' but there is no profile for device type "
            f"{device_type!r} at {where}; run `segue bench-model` for it on this device, or give a batch_size"
        )
    return int(profile["recommended_batch_size"])


def device_type_of(device: str) -> str:
    """The pricing catalog's key of the device a handler runs on (``cpu`` for the CPU)."""
    if not device.startswith("cuda"):
        return "cpu" if device == "cpu" else device
    import torch

    from ..placement.pricing import device_type

    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return device_type(props.name, int(props.total_memory), False)
