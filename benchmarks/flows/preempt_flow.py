"""The flow measured by benchmarks.preemption: one GPU step with a pause point every `tick`.

Like recovery_flow, it leaves side-channel files in `probe_dir`:
`started-EPOCH` (restore finished, from which iteration) and `cursor`.
"""

import json
import os
import time

import numpy as np

from segue import Flow

flow = Flow("preempt", params={"n": 300, "tick": 0.01, "probe_dir": ""})


@flow.step(gpus=1, cpus=0.5, retries=20, checkpoint_every="1s")
def work(ctx):
    p = ctx.params
    state = ctx.restore() or {"i": 0, "w": np.zeros(4096)}
    probe = p["probe_dir"]
    tmp = os.path.join(probe, f"started-{ctx.epoch}.tmp")
    with open(tmp, "w") as f:
        json.dump({"t": time.time(), "from": state["i"]}, f)
    os.replace(tmp, os.path.join(probe, f"started-{ctx.epoch}"))
    fd = os.open(os.path.join(probe, "cursor"), os.O_RDWR | os.O_CREAT, 0o644)
    while state["i"] < p["n"]:
        time.sleep(p["tick"])
        state["w"] += 1.0
        state["i"] += 1
        os.pwrite(fd, state["i"].to_bytes(8, "little"), 0)
        if ctx.checkpoint_due(state["i"]):
            ctx.checkpoint(state, position={"i": state["i"]})
    return {"i": state["i"]}
