"""A small deterministic flow for integration tests.

``hold=PATH`` keeps the last iteration waiting until PATH exists, so a test's
faults cannot race the end of the run.

``ignore_pause=true`` plays a stubborn step that never reaches a pause point:
it checkpoints once (then never again, since any checkpoint call may park it)
and then creates the file ``ready``, so a test pauses it only once it has a
checkpoint and can no longer park by itself.

`count` draws from three RNGs (a Generator in its state, Python's global
`random`, NumPy's global RNG) on every iteration, so any lost, repeated or
wrongly restored iteration changes its result.
"""

import os
import random
import time

import numpy as np

from segue import Flow

flow = Flow("counter", params={"n": 300, "sleep": 0.004, "fail_marker": "", "ignore_pause": False,
                               "hold": "", "ready": ""})


def hold(ctx, p, state):
    """The test's gate: the last iteration waits until the file ``hold`` exists.

    A test's faults then all land before the run can finish, however slow or
    fast the machine is. A pause request still parks the step here.
    """
    last = 0.0
    while p["hold"] and not os.path.exists(p["hold"]):
        # Keep committing now and then while held (twice a second, not at the
        # step's pace: a flood of events would slow the test), so a test that
        # waits for this attempt's next checkpoint sees it; on a pause request
        # the checkpoint parks.
        due = time.monotonic() - last > 0.5 or ctx.pause_requested
        if due and not p["ignore_pause"]:
            ctx.checkpoint(state, position={"i": state["i"]})
            last = time.monotonic()
        time.sleep(0.01)


@flow.step(retries=20, checkpoint_every="50ms")
def count(ctx):
    p = ctx.params
    state = ctx.restore()
    if state is None:
        random.seed(11)
        np.random.seed(12)
        state = {"i": 0, "acc": 0.0, "gen": np.random.default_rng(13), "hist": np.zeros(8, dtype=np.int64)}
    stubborn_done = False  # the stubborn step's one checkpoint of this attempt
    while state["i"] < p["n"]:
        if state["i"] == p["n"] - 1:
            hold(ctx, p, state)
        if p["fail_marker"] and os.path.exists(p["fail_marker"]):
            raise RuntimeError("fail marker present")
        a = state["gen"].random() + random.random() + np.random.rand()
        state["acc"] += a
        state["hist"][int(a * 8 / 3) % 8] += 1
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
    return {"acc": state["acc"], "i": state["i"], "hist": state["hist"]}


@flow.step(after=[count], retries=2)
def report(ctx):
    got = ctx.inputs["count"]
    return {"acc2": got["acc"] * 2, "n": int(got["i"])}
