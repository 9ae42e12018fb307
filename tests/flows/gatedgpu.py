"""A GPU step that can wait at a gate: for accounting tests on virtual GPUs.

At iteration ``hold_at`` the step waits until the file ``gate`` exists (a
pause request parks it there, at a checkpoint), so a test can kill or preempt
it at a known point however slow the machine is. It checkpoints every 10
iterations, so the checkpoint at ``hold_at`` (a multiple of 10) lands just
before the wait.
"""

import os
import time

import numpy as np

from segue import Flow

flow = Flow("gatedgpu", params={"n": 200, "hold_at": 100, "gate": ""})


@flow.step(gpus=1, cpus=0.5, retries=5, checkpoint_every_steps=10)
def work(ctx):
    p = ctx.params
    state = ctx.restore() or {"i": 0, "acc": 0.0, "gen": np.random.default_rng(3)}
    while state["i"] < p["n"]:
        if state["i"] == p["hold_at"] and p["gate"]:
            while not os.path.exists(p["gate"]):
                if ctx.pause_requested:
                    ctx.checkpoint(state, position={"i": state["i"]})  # commits, then parks
                time.sleep(0.01)
        state["acc"] += state["gen"].random()
        state["i"] += 1
        ctx.progress(state["i"], p["n"])
        if ctx.checkpoint_due(state["i"]):
            ctx.checkpoint(state, position={"i": state["i"]})
    return {"acc": state["acc"], "i": state["i"]}
