"""A small deterministic flow for integration tests.

`count` draws from three RNGs (a Generator in its state, Python's global
`random`, NumPy's global RNG) on every iteration, so any lost, repeated or
wrongly restored iteration changes its result.
"""

import os
import random
import time

import numpy as np

from segue import Flow

flow = Flow("counter", params={"n": 300, "sleep": 0.004, "fail_marker": "", "ignore_pause": False})


@flow.step(retries=20, checkpoint_every="50ms")
def count(ctx):
    p = ctx.params
    state = ctx.restore()
    if state is None:
        random.seed(11)
        np.random.seed(12)
        state = {"i": 0, "acc": 0.0, "gen": np.random.default_rng(13), "hist": np.zeros(8, dtype=np.int64)}
    while state["i"] < p["n"]:
        if p["fail_marker"] and os.path.exists(p["fail_marker"]):
            raise RuntimeError("fail marker present")
        a = state["gen"].random() + random.random() + np.random.rand()
        state["acc"] += a
        state["hist"][int(a * 8 / 3) % 8] += 1
        state["i"] += 1
        time.sleep(p["sleep"])
        ctx.progress(state["i"], p["n"])
        due = ctx.checkpoint_due(state["i"])
        if due and not (p["ignore_pause"] and ctx.pause_requested):
            ctx.checkpoint(state, position={"i": state["i"]})
    return {"acc": state["acc"], "i": state["i"], "hist": state["hist"]}


@flow.step(after=[count], retries=2)
def report(ctx):
    got = ctx.inputs["count"]
    return {"acc2": got["acc"] * 2, "n": int(got["i"])}
