"""A GPU step for scheduler tests: pause points every `sleep` seconds.

With ``gate=PATH`` it holds half-way until PATH exists.

``ignore_pause=true`` plays a stubborn step: it checkpoints once (a checkpoint
call may park it, so never again) and then creates the file ``ready``; paused
after that, it can only be killed at the pause deadline.

Each attempt records the devices it was given (CUDA_VISIBLE_DEVICES), and
what torch sees when a real GPU is present.
"""

import os
import time

import numpy as np

from segue import Flow

flow = Flow("gpujob", params={"n": 300, "sleep": 0.01, "ignore_pause": False, "gate": "",
                              "ready": ""})


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
    stubborn_done = False  # the stubborn step's one checkpoint of this attempt
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
        due = ctx.checkpoint_due(state["i"])
        if due and not p["ignore_pause"]:
            ctx.checkpoint(state, position={"i": state["i"]})
        elif due and not stubborn_done:
            ctx.checkpoint(state, position={"i": state["i"]}, durable=True)
            stubborn_done = True
            if p["ready"]:
                with open(p["ready"], "w") as f:
                    f.write(str(state["i"]))
    return {"acc": state["acc"], "i": state["i"], "seen": state["seen"]}
