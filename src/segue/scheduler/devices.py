"""What a host offers: GPUs found through NVML or nvidia-smi, or configured virtual ones.

Detection never fails a run: with no driver and no configuration the host
simply has no GPUs, and a step that needs one waits with a reason that says
how to configure virtual devices.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ..store.pool import HostPool, PoolStore

Devices = list[tuple[str, int, bool]]  # (name, memory bytes, virtual)


def detect_gpus() -> tuple[str, Devices]:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            out: Devices = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                out.append((name, int(pynvml.nvmlDeviceGetMemoryInfo(h).total), False))
            return "nvml", out
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # not installed, no driver, no device: try the CLI next
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            res = subprocess.run(
                [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=10, check=True,
            )
            devs: Devices = []
            for line in res.stdout.strip().splitlines():
                name, mib = (x.strip() for x in line.rsplit(",", 1))
                devs.append((name, int(float(mib)) << 20, False))
            return "nvidia-smi", devs
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return "none", []


def host_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def virtual_gpus(n: int, memory: int) -> Devices:
    return [(f"virtual-{i}", memory, True) for i in range(n)]


def ensure_host(store: PoolStore, host: str) -> HostPool:
    """The host's pool entry, detecting the hardware the first time."""
    hp = store.get_host(host)
    if hp is not None:
        return hp
    source, devices = detect_gpus()
    return store.configure_host(host, cpus=float(os.cpu_count() or 1), memory=host_memory(),
                                devices=devices, source=source)
