"""A two-rank gang step for the coordinated-checkpoint tests.

Each rank draws from its own generator and checkpoints every 5 steps (one
checkpoint of the gang); with ``gate=PATH`` it holds (at pause points) after
step ``hold`` until PATH exists. Rank 0 returns what every rank's state
should agree on: the step count and its own sum.
"""

import os
import time

import numpy as np

from segue import Flow

flow = Flow("gang", params={"n": 40, "sleep": 0.0, "gate": "", "hold": 20})


def expected_acc(rank: int, n: int) -> float:
    gen = np.random.default_rng(100 + rank)
    return float(sum(gen.random() * (rank + 1) for _ in range(n)))


@flow.step(world_size=2, retries=10, checkpoint_every_steps=5)
def train(ctx):
    p = ctx.params
    state = ctx.restore() or {"i": 0, "acc": 0.0, "gen": np.random.default_rng(100 + ctx.rank),
                              "starts": []}
    state["starts"].append(state["i"])
    while state["i"] < p["n"]:
        if p["gate"] and state["i"] >= p["hold"] and not os.path.exists(p["gate"]):
            time.sleep(0.01)
            if ctx.checkpoint_due(state["i"]):  # a collective: the pause point of every rank
                ctx.checkpoint(state, position={"i": state["i"]})
            continue
        state["acc"] += state["gen"].random() * (ctx.rank + 1)
        state["i"] += 1
        time.sleep(p["sleep"])
        ctx.progress(state["i"], p["n"])
        if ctx.checkpoint_due(state["i"]):
            ctx.checkpoint(state, position={"i": state["i"]})
    return {"i": state["i"], "acc": state["acc"], "rank": ctx.rank, "world_size": ctx.world_size}
