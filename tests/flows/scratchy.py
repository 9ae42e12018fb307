"""A step that keeps a log file in ``ctx.scratch`` (tests/integration/test_scratch.py).

Each iteration ``i`` appends ``line i`` to ``ctx.scratch/log/lines.txt`` and counts in
the state; every ``every`` iterations it checkpoints, then at once appends more (the
checkpoint must hold the file as it was at the call). At ``hold_at`` it writes
``GATE/held-<epoch>`` and waits, committing nothing, until ``GATE/go`` exists; a
pause request there parks it with a checkpoint. Each attempt writes what it found at
its start (its state and every file of ``ctx.scratch``) to ``GATE/start-<epoch>.json``.
``big`` > 0: the first iteration also writes a file of that many bytes (over the
declared 64kB, the checkpoint is refused).
"""

import json
import os
import time
from pathlib import Path

from segue import Flow

flow = Flow("scratchy", params={"n": 20, "every": 5, "hold_at": 0, "gate": "", "big": 0})


def expected(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


@flow.step(retries=3, scratch="64kB", checkpoint_every="1h")
def grow(ctx):
    p = ctx.params
    gate = Path(p["gate"])
    state = ctx.restore() or {"i": 0}
    root = ctx.scratch
    found = {str(f.relative_to(root)): f.read_text() for f in sorted(root.rglob("*")) if f.is_file()}
    dirs = sorted(str(d.relative_to(root)) for d in root.rglob("*") if d.is_dir())
    (gate / f"start-{ctx.epoch}.json").write_text(json.dumps(
        {"i": state["i"], "files": found, "dirs": dirs, "scratch": str(root)}))
    (root / "log").mkdir(exist_ok=True)
    (root / "empty-dir").mkdir(exist_ok=True)
    log = root / "log" / "lines.txt"
    while state["i"] < p["n"]:
        i = state["i"] + 1
        if p["big"] and i == 1:
            (root / "big.bin").write_bytes(b"x" * p["big"])
        with open(log, "a") as f:
            f.write(f"line {i}\n")
        state["i"] = i
        if i % p["every"] == 0:
            ctx.checkpoint(state, position={"i": i})
        if i == p["hold_at"]:
            (gate / f"held-{ctx.epoch}").write_text(str(i))
            while not (gate / "go").exists():
                if ctx.pause_requested:
                    ctx.checkpoint(state, position={"i": i})  # parks
                time.sleep(0.01)
    return {"log": log.read_text(), "i": state["i"], "scratch": str(root),
            "pid": os.getpid()}


@flow.step(after=[grow])
def nosy(ctx):
    """Declares no scratch: using ctx.scratch is refused with one line."""
    return str(ctx.scratch) if ctx.params["big"] < 0 else None
