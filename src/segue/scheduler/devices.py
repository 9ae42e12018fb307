"""What a host offers: GPUs found through NVML or nvidia-smi, or configured virtual ones.

Detection never fails a run: with no driver and no configuration the host
simply has no GPUs, and a step that needs one waits with a reason that says
how to configure virtual devices.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ..executor.base import PoolHost
from ..store.pool import HostPool, HostPoolStore

Devices = list[tuple[str, int, bool]]  # (name, memory bytes, virtual)
# device index -> [(pid, used memory bytes)] of every process the driver sees on it
GpuProcesses = dict[int, list[tuple[int, int]]]


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


def virtual_gpus(n: int, memory: int, kind: str | None = None, start: int = 0) -> Devices:
    """``n`` virtual GPUs of ``memory`` bytes. With ``kind`` (a device type such as
    'h100' or 'rtx-pro-6000') they are named by that type, so steps with an
    ``accelerator=`` hint match them; without, they are 'virtual-N'."""
    if kind:
        from ..placement.policy import canonical_accelerator

        return [(canonical_accelerator(kind), memory, True) for _ in range(n)]
    return [(f"virtual-{start + i}", memory, True) for i in range(n)]


def parse_group(text: str) -> tuple[int, str, str | None]:
    """``COUNTxMEM[:TYPE]`` (the ``--group`` flag of `segue pool set`), e.g. '2x96GB:rtx-pro-6000'
    -> (2, '96GB', 'rtx-pro-6000')."""
    from ..errors import UsageError

    spec, _, kind = text.partition(":")
    count, x, mem = spec.partition("x")
    if not x or not count.strip().isdigit() or not mem.strip():
        raise UsageError(f"--group {text!r} must look like COUNTxMEM[:TYPE], e.g. 2x96GB:rtx-pro-6000")
    return int(count), mem.strip(), kind.strip() or None


def ensure_host(store: HostPoolStore, host: str) -> HostPool:
    """The host's pool entry, detecting the hardware the first time."""
    hp = store.get_host(host)
    if hp is not None:
        return hp
    source, devices = detect_gpus()
    # Only if still absent, in the write's own transaction: a `segue pool set` (or
    # PUT /api/pool) between the read above and this write must win.
    return store.configure_host(host, cpus=float(os.cpu_count() or 1), memory=host_memory(),
                                devices=devices, source=source, only_if_new=True)


def ensure_cluster_host(store: HostPoolStore, found: PoolHost) -> HostPool:
    """The pool entry of an executor's cluster (Ray), configured from what the cluster
    reports. It only grows by itself: nodes added (or back) add their GPUs; a node
    that is down for a while removes nothing, so a run queued for its GPUs waits
    (in Ray's queue) instead of failing as unsatisfiable."""
    hp = store.get_host(found.host)
    if hp is None or (hp.source == found.source and len(found.devices) > len(hp.devices)):
        return store.configure_host(
            found.host, cpus=found.cpus, memory=found.memory, devices=found.devices,
            source=found.source, only_if_new=hp is None,
            actor=None if hp is None else f"{found.source} (the cluster has {len(found.devices)} GPUs now)")
    return hp


def gpu_processes() -> GpuProcesses:
    """Processes that use each physical GPU now, as NVML (or nvidia-smi) sees them.

    Used by `segue pool` to show devices that something outside the pool
    already uses. Empty when there is no driver. Never fails.
    """
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            out: GpuProcesses = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                procs = {}
                for get in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                            pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                    for p in get(h):
                        procs[int(p.pid)] = int(getattr(p, "usedGpuMemory", 0) or 0)
                out[i] = sorted(procs.items())
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # not installed, no driver: try the CLI next
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        idx = subprocess.run([smi, "--query-gpu=index,uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        by_uuid = {u.strip(): int(i) for i, u in
                   (line.split(",", 1) for line in idx.stdout.strip().splitlines())}
        res = subprocess.run(
            [smi, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True)
        found: GpuProcesses = {i: [] for i in by_uuid.values()}
        for line in res.stdout.strip().splitlines():
            uuid, pid, mib = (x.strip() for x in line.split(","))
            if uuid in by_uuid:
                found[by_uuid[uuid]].append((int(pid), int(float(mib)) << 20))
        return found
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
