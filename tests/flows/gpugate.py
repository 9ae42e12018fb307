"""A GPU step that runs until a gate file exists (tests decide when it ends, not a clock).

It has pause points (checkpoints every 100ms), so it can be preempted and
resumed; its output is checkable bit for bit: ``acc`` is the sum of the first
``ticks`` draws of a seeded generator (``expected_acc`` of gpujob.py), so a
lost or repeated tick shows.
"""

import os
import time
from pathlib import Path

import numpy as np

from segue import Flow

flow = Flow("gpugate", params={"gate": ""})


@flow.step(gpus=1, cpus=0.5, retries=5, checkpoint_every="100ms")
def hold(ctx):
    state = ctx.restore() or {"ticks": 0, "acc": 0.0, "gen": np.random.default_rng(3), "seen": []}
    state["seen"].append(os.environ.get("CUDA_VISIBLE_DEVICES"))
    gate = Path(ctx.params["gate"])
    while not gate.exists():
        state["acc"] += state["gen"].random()
        state["ticks"] += 1
        time.sleep(0.01)
        if ctx.checkpoint_due(state["ticks"]):
            ctx.checkpoint(state, position={"ticks": state["ticks"]})
    return {"ticks": state["ticks"], "acc": state["acc"], "seen": state["seen"]}
