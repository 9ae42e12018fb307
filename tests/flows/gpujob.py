"""A GPU step for scheduler tests: pause points every `sleep` seconds.

With ``gate=PATH`` it holds half-way until PATH exists.

Each attempt records the devices it was given (CUDA_VISIBLE_DEVICES), and
what torch sees when a real GPU is present.
"""

import os
import time

import numpy as np

from segue import Flow

flow = Flow("gpujob", params={"n": 300, "sleep": 0.01, "ignore_pause": False, "gate": ""})


def expected_acc(n: int) -> float:
    gen = np.random.default_rng(3)
    acc = 0.0
    for _ in range(n):
        acc += gen.random()
    return acc


@flow.step(gpus=1, cpus=0.5, retries=5, checkpoint_every="100ms")
def work(ctx):
    p = ctx.params
    state = ctx.restore() or {"i": 0, "acc": 0.0, "gen": np.random.default_rng(3), "seen": []}
    seen = {"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "attempt": ctx.attempt}
    try:
        import torch

        if torch.cuda.is_available():
            seen["torch_device_count"] = torch.cuda.device_count()
    except ImportError:
        pass
    state["seen"].append(seen)
    while state["i"] < p["n"]:
        if p["gate"] and state["i"] >= p["n"] // 2 and not os.path.exists(p["gate"]):
            # Half-way, hold (with pause points) until the test opens the gate: the
            # test, not the machine's speed, decides when the run may end.
            time.sleep(0.01)
            if ctx.pause_requested and not p["ignore_pause"]:
                ctx.checkpoint(state, position={"i": state["i"]})  # parks
            continue
        state["acc"] += state["gen"].random()
        state["i"] += 1
        time.sleep(p["sleep"])
        ctx.progress(state["i"], p["n"])
        if ctx.checkpoint_due(state["i"]) and not (p["ignore_pause"] and ctx.pause_requested):
            ctx.checkpoint(state, position={"i": state["i"]})
    return {"acc": state["acc"], "i": state["i"], "seen": state["seen"]}
