"""What the two demos share (`make demo`, `make demo-llm`): the pool, waits, and the figures
a preemption leaves in the runs' event histories."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def require(modules: tuple[str, ...], prog: str) -> None:
    """Exit with one line when a module the demo needs is missing (found, not imported)."""
    import importlib.util

    for module in modules:
        if importlib.util.find_spec(module) is None:
            sys.exit(f"{prog}: {module} is missing; install the demo's extras: pip install -e '.[demo]'")


def pool_setup(console: Any, home: Path, pool: Path, prog: str) -> None:
    """This machine's GPUs in the demo's own pool file, or one virtual GPU of 24 GB."""
    env = {**os.environ, "SEGUE_HOME": str(home), "SEGUE_POOL": str(pool)}
    real = shutil.which("nvidia-smi") is not None
    args = ["pool", "detect"] if real else ["pool", "set", "--gpus", "1", "--gpu-mem", "24GB"]
    proc = subprocess.run([sys.executable, "-m", "segue", *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{prog}: `segue {' '.join(args)}` failed: {proc.stderr.strip()}")
    console.print("   GPU: " + ("this machine's, as NVML reports them" if real else
                                 "1 virtual GPU of 24 GB (no GPU here: the model runs on the CPU)"))


def progress(client: Any, run: str, step: str) -> float:
    """The fraction of the input done (a file source counts bytes, not records)."""
    p = client.status(run).step(step).progress
    return float(p.get("done") or 0) / float(p.get("total") or 1)


def wait(cond: Callable[[], Any], what: str, timeout: float, prog: str) -> Any:
    """``cond()``'s first truthy value, polled; the demo exits saying what it waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    sys.exit(f"{prog}: timed out waiting for {what}")


def figures(nightly: list[Any], urgent: list[Any], t_submit: float) -> dict[str, Any]:
    """Pause latency, time to device and reload cost, from the runs' event histories."""
    def first(events: list[Any], pred: Callable[[Any], bool]) -> Any:
        return next((e for e in events if pred(e)), None)

    pausing = first(nightly, lambda e: e.kind == "run" and e.to_state == "PAUSING")
    paused = first(nightly, lambda e: e.kind == "run" and e.to_state == "PAUSED")
    running = first(urgent, lambda e: e.kind == "task" and e.to_state == "RUNNING")
    loads = [e for e in nightly if e.kind == "model" and "loaded" in e.reason]
    reloads = [e for e in loads if e.data.get("reload")]
    return {
        "preempted": pausing is not None and paused is not None,
        "pause_s": paused.time - pausing.time if pausing and paused else None,
        "pause_reason": pausing.reason if pausing else "",
        "to_device_s": running.time - t_submit if running else None,
        "reload_s": sum(e.data["seconds"] for e in reloads),
        "loads": len(loads),
    }
