"""A plain training-style step: epochs of batches, the batch index restarting each epoch.

Its position names where it is ({"epoch", "batch"}); its progress is the
batches done of all epochs (``ctx.progress``). The UI must chart the second:
the position's batch is a sawtooth. ``hold=PATH`` keeps the last batch waiting
until PATH exists (heartbeating), so a test can act on a live attempt.
"""

import os
import time

from segue import Flow

flow = Flow("epochs", params={"epochs": 3, "batches": 30, "sleep": 0.004, "hold": ""})


@flow.step(retries=3, checkpoint_every_steps=4)
def train(ctx):
    p = ctx.params
    st = ctx.restore() or {"epoch": 0, "batch": 0, "loss": 0.0}
    total = p["epochs"] * p["batches"]
    while st["epoch"] < p["epochs"]:
        while st["batch"] < p["batches"]:
            done = st["epoch"] * p["batches"] + st["batch"]
            while done == total - 1 and p["hold"] and not os.path.exists(p["hold"]):
                time.sleep(0.01)
            st["batch"] += 1
            st["loss"] += 1.0 / (done + 1)
            time.sleep(p["sleep"])
            ctx.progress(done + 1, total)
            if ctx.checkpoint_due(done + 1):
                ctx.checkpoint(st, position={"epoch": st["epoch"], "batch": st["batch"]})
        st["epoch"] += 1
        st["batch"] = 0
    return {"loss": st["loss"], "batches": total}
