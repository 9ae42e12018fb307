"""The flow measured by benchmarks.recovery.

One step iterates every `tick` seconds (a pause point every iteration) and
checkpoints every `every` seconds. It writes two tiny side-channel files that
cost no database traffic: `started-EPOCH` (when the attempt finished restoring
and from which position) and `cursor` (the iteration it is on, via pwrite).
"""

import json
import os
import time

import numpy as np

from segue import Flow

flow = Flow("recovery", params={"n": 100_000, "tick": 0.01, "probe_dir": "", "state_kb": 256})


@flow.step(retries=50, checkpoint_every="1s")
def work(ctx):
    p = ctx.params
    state = ctx.restore() or {"i": 0, "w": np.zeros(p["state_kb"] * 128)}
    probe = p["probe_dir"]
    with open(os.path.join(probe, f"started-{ctx.epoch}.tmp"), "w") as f:
        json.dump({"t": time.time(), "from": state["i"]}, f)
    os.replace(os.path.join(probe, f"started-{ctx.epoch}.tmp"), os.path.join(probe, f"started-{ctx.epoch}"))
    fd = os.open(os.path.join(probe, "cursor"), os.O_RDWR | os.O_CREAT, 0o644)
    while state["i"] < p["n"]:
        time.sleep(p["tick"])  # stands for one unit of work
        state["w"] += 1.0
        state["i"] += 1
        os.pwrite(fd, state["i"].to_bytes(8, "little"), 0)
        if ctx.checkpoint_due(state["i"]):
            ctx.checkpoint(state, position={"i": state["i"]})
    return {"i": state["i"]}
