"""Shared by the engine benchmarks: polling, the flows' side-channel files, floors.

The benchmark flows write `started-EPOCH` (restore done, from which iteration)
and `cursor` (current iteration, via pwrite) into a probe directory, so the
benchmarks can time events without adding database traffic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(pred: Callable[[], T | None], timeout: float = 120.0, poll: float = 0.002,
               what: str = "benchmark condition") -> T:
    """``pred()``'s first truthy value (so never None), polled every ``poll`` s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    raise TimeoutError(f"{what} not reached within {timeout:g}s")


def started(probe: Path, epoch: int) -> dict | None:
    p = probe / f"started-{epoch}"
    return json.loads(p.read_text()) if p.exists() else None


def cursor(probe: Path) -> int:
    try:
        return int.from_bytes((probe / "cursor").read_bytes()[:8], "little")
    except (OSError, ValueError):
        return 0


def private_pool(where: Path) -> None:
    """Point this process and its children at a host pool of their own.

    The device and CPU pool is machine-wide (every home of the host shares it): a
    benchmark run must neither wait behind other users' runs nor hold their
    capacity, so it gets its own pool file ($SEGUE_POOL, inherited by the CLI,
    the controllers and the workers).
    """
    os.environ["SEGUE_POOL"] = str(where / "pool.db")  # segue.store.hostpool.POOL_ENV


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    if not pid:
        return False
    try:
        return b") Z" not in Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False


def byte_compile_segue() -> list[str]:
    """Byte-compile segue's own sources, as installing its wheel does (pip compiles every
    package it installs, the peers' included), so no process of the benchmark compiles
    them at start-up. An editable install has no bytecode, and where
    $PYTHONDONTWRITEBYTECODE is set (this project's machines) none is ever written: every
    segue process then compiled its imports from source, 40-50 ms of CPU each. Returns
    the benchmark's first ``notes`` (none where segue's directory is read-only)."""
    import compileall

    import segue

    root = Path(segue.__file__).parent
    if not os.access(root, os.W_OK):
        return []
    ok = compileall.compile_dir(str(root), quiet=1)
    return [f"segue's sources byte-compiled before timing ({root}), as installing its wheel does"
            if ok else f"some of segue's sources could not be byte-compiled ({root})"]


def worker_startup_s() -> float:
    """The physical floor of any recovery: starting a Python worker with its imports."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import numpy, segue.run.worker"], check=True)
        best = min(best, time.perf_counter() - t0)
    return best


def goals(values: dict[str, Any], table: dict[str, tuple[str, float]]) -> dict[str, Any]:
    """The ``goals`` object every benchmark prints: per key its target, value and whether
    it was met (None when the figure was not measured)."""
    out = {}
    for key, (op, target) in table.items():
        v = values.get(key)
        met = None if v is None else (v >= target if op == ">=" else v <= target)
        out[key] = {"target": f"{op} {target}", "value": v, "met": met}
    return out
