"""A device's memory capacity: a GPU's total, or on the CPU the machine's memory or its cgroup's limit.

Shared by ``segue bench-model`` (a profile's capacity) and the generate
handlers' KV budget (the memory left after the weights). Reads ``/proc`` and
``/sys`` only; torch is imported only for a CUDA device.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UsageError


def cpu_capacity() -> tuple[int, str]:
    """The machine's memory, or the cgroup's limit when lower: (bytes, where from)."""
    kib = None
    try:
        m = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        kib = int(m.group(1)) if m else None
    except OSError:
        pass
    best = (kib * 1024, "MemTotal") if kib else (0, "unknown")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (best[0] == 0 or int(text) < best[0]):
            best = (int(text), f"cgroup {path}")
    if best[0] == 0:
        raise UsageError("cannot tell this machine's memory (no /proc/meminfo nor cgroup limit)")
    return best


def device_capacity(device: str) -> tuple[int, str]:
    """(bytes, where from) of ``device``: ``cpu`` as :func:`cpu_capacity`, ``cuda[:N]`` its total memory."""
    if not device.startswith("cuda"):
        return cpu_capacity()
    import torch

    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    return int(torch.cuda.get_device_properties(index).total_memory), "cuda total_memory"
