"""A step whose result depends on torch's CPU RNG (and CUDA's when present)."""

import os
import time

import torch

from segue import Flow

flow = Flow("torchrng", params={"n": 200, "sleep": 0.005, "hold": ""})


@flow.step(retries=10, checkpoint_every="50ms")
def draw(ctx):
    state = ctx.restore()
    if state is None:
        torch.manual_seed(5)
        state = {"i": 0, "acc": torch.zeros(4, dtype=torch.float64)}
        if torch.cuda.is_available():
            state["cuda_acc"] = torch.zeros(4, device="cuda")
    while state["i"] < ctx.params["n"]:
        # The test's gate: the last draw waits for the file `hold`, so its kills land first.
        while state["i"] == ctx.params["n"] - 1 and ctx.params["hold"] and not os.path.exists(
                ctx.params["hold"]):
            time.sleep(0.01)
        state["acc"] += torch.rand(4, dtype=torch.float64)
        if "cuda_acc" in state:
            state["cuda_acc"] += torch.rand(4, device="cuda")
        state["i"] += 1
        time.sleep(ctx.params["sleep"])
        if ctx.checkpoint_due(state["i"]):
            ctx.checkpoint(state)
    out = {"acc": state["acc"].numpy()}
    if "cuda_acc" in state:
        out["cuda_acc"] = state["cuda_acc"].cpu().numpy()
    return out
