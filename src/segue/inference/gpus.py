"""The GPU catalog of the planner: memory capacity, memory bandwidth, dense bf16 compute.

Keys are those of :data:`segue.placement.pricing.CATALOG`, so a GPU's price per
hour comes from :class:`~segue.placement.pricing.Prices` (defaults, the home's
own prices, ``--price``). This module holds datasheet numbers only.

Capacity is the total the driver reports (``nvidia-smi``'s MiB), which is what
a framework can allocate from, not the marketing figure: an "80 GB" H100
reports 81559 MiB (85.5 GB), a "141 GB" H200 143771 MiB. Bandwidth and dense
(no-sparsity) bf16 TFLOPS are the datasheet figures of the SXM part where there
are several; the RTX PRO 6000's bf16 figure is approximate (NVIDIA publishes
its FP4 rate; bf16 dense is about an eighth of the sparse FP4 rate).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError
from ..placement.pricing import device_type
from ..units import in_unit

MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    """One GPU type. ``bandwidth`` in bytes/s and ``flops`` (dense bf16) in FLOP/s; None when unknown."""

    key: str
    label: str
    capacity_bytes: int
    bandwidth: float | None
    flops: float | None


CATALOG: dict[str, Gpu] = {g.key: g for g in (
    Gpu("rtx-pro-6000-blackwell", "NVIDIA RTX PRO 6000 Blackwell (96 GB GDDR7)", 97887 * MIB,
        1792e9, 500e12),
    Gpu("l4", "NVIDIA L4 (24 GB GDDR6)", 23034 * MIB, 300e9, 121e12),
    Gpu("a100-40gb", "NVIDIA A100 40GB (HBM2)", 40960 * MIB, 1555e9, 312e12),
    Gpu("a100-80gb", "NVIDIA A100 80GB SXM (HBM2e)", 81920 * MIB, 2039e9, 312e12),
    Gpu("h100", "NVIDIA H100 80GB SXM (HBM3)", 81559 * MIB, 3350e9, 989e12),
    Gpu("h200", "NVIDIA H200 141GB (HBM3e)", 143771 * MIB, 4800e9, 989e12),
    Gpu("b200", "NVIDIA B200 180GB (HBM3e)", 183359 * MIB, 8000e9, 2250e12),
)}

ALIASES: dict[str, str] = {
    "rtx-pro-6000": "rtx-pro-6000-blackwell", "rtx-6000-pro": "rtx-pro-6000-blackwell",
    "rtx-pro-6000-blackwell-server": "rtx-pro-6000-blackwell", "pro-6000": "rtx-pro-6000-blackwell",
    "a100-40": "a100-40gb", "a100-80": "a100-80gb", "h100-80gb": "h100", "h100-sxm": "h100",
    "h200-141gb": "h200", "b200-180gb": "b200", "l4-24gb": "l4",
}


def gpu(name: str) -> Gpu:
    """A catalog GPU by key, alias (``rtx-pro-6000``) or device name (``NVIDIA H100 80GB HBM3``)."""
    key = re.sub(r"[\s_]+", "-", name.strip().lower()).removeprefix("nvidia-")
    key = ALIASES.get(key, key)
    if key not in CATALOG and " " in name.strip():  # a device name, as torch or nvidia-smi print it
        key = device_type(name, 0, False)
    if key not in CATALOG:
        raise UsageError(f"unknown GPU {name!r}; use one of {', '.join(CATALOG)} "
                         f"(or rtx-pro-6000), or give --gpu-mem SIZE")
    return CATALOG[key]


def custom(capacity_bytes: int, base: Gpu | None = None) -> Gpu:
    """A GPU of ``capacity_bytes`` (``--gpu-mem``), keeping ``base``'s bandwidth and price key."""
    if capacity_bytes <= 0:
        raise UsageError(f"--gpu-mem must be more than 0 bytes, not {capacity_bytes}")
    if base is None:
        return Gpu("gpu", "a GPU of the given memory", capacity_bytes, None, None)
    return Gpu(base.key, f"{base.label}, {in_unit(capacity_bytes, 'GB')} given", capacity_bytes,
               base.bandwidth, base.flops)
