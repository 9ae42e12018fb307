"""The step benchmarks.scale loses a Ray node under: a counter that checkpoints every 50 ms.

``count`` adds ``i * i`` for ``i`` below ``n`` (a few ms per iteration) and
checkpoints its position every 50 ms, so the benchmark sees the first attempt's
first commit at once and the second attempt's first commit right after its
restore. ``hold=PATH`` keeps the last iteration waiting (still committing twice
a second) until PATH exists, so the node loss always lands before the step can
end. The output is checked: every iteration counted exactly once.
"""

import os
import time

from segue import Flow

flow = Flow("bench_ray_loss", params={"n": 400, "sleep": 0.005, "hold": ""})


@flow.step(retries=5, checkpoint_every="50ms")
def count(ctx):
    p = ctx.params
    state = ctx.restore() or {"i": 0, "acc": 0}
    while state["i"] < p["n"]:
        if state["i"] == p["n"] - 1:
            last = 0.0
            while p["hold"] and not os.path.exists(p["hold"]):
                if time.monotonic() - last > 0.5 or ctx.pause_requested:
                    ctx.checkpoint(state, position={"i": state["i"]})
                    last = time.monotonic()
                time.sleep(0.01)
        state["acc"] += state["i"] * state["i"]
        state["i"] += 1
        time.sleep(p["sleep"])
        ctx.progress(state["i"], p["n"])
        if ctx.checkpoint_due(state["i"]):
            ctx.checkpoint(state, position={"i": state["i"]})
    return {"i": state["i"], "acc": state["acc"]}
