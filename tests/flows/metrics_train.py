"""A training-style step that logs metrics every step (``ctx.log_metrics``).

``loss`` is drawn from a generator kept in the checkpointed state, so a wrongly
restored or repeated step logs a different value; ``lr`` follows a schedule; at
step 3 the loss is NaN (stored as null). With ``hold_at=K`` the first attempt
waits at step K, after logging it, until it is killed: a test sees its points
past the last checkpoint in the store, then kills it, and the retry redoes them.
"""

import time

import numpy as np

from segue import Flow

flow = Flow("metrics_train", params={"n": 30, "sleep": 0.002, "hold_at": -1})


def expected(n: int) -> list[tuple[int, float | None, float]]:
    """(step, loss, lr) of an uninterrupted run."""
    gen = np.random.default_rng(7)
    out = []
    for i in range(n):
        loss = float(gen.random())
        out.append((i, None if i == 3 else loss, 0.1 * 0.9**i))
    return out


@flow.step(retries=3, checkpoint_every_steps=5)
def train(ctx):
    p = ctx.params
    st = ctx.restore() or {"i": 0, "gen": np.random.default_rng(7)}
    while st["i"] < p["n"]:
        i = st["i"]
        loss = float(st["gen"].random())
        ctx.log_metrics(step=i, loss=float("nan") if i == 3 else loss, lr=0.1 * 0.9**i)
        st["i"] += 1
        time.sleep(p["sleep"])
        while i == p["hold_at"] and ctx.attempt == 1:
            time.sleep(0.01)  # heartbeating: the test sees the points, then kills this attempt
        if ctx.checkpoint_due(st["i"]):
            ctx.checkpoint(st, position={"i": st["i"]})
    return {"steps": st["i"]}
