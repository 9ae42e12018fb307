"""A flow with an at-least-once side effect: it appends records as it goes,
outside any commit protocol. `segue verify` must catch the duplicates."""

import json
import os
import time

from segue import Flow

flow = Flow("leaky", params={"n": 300, "sleep": 0.005})


@flow.step(retries=50, checkpoint_every="200ms")
def write(ctx):
    state = ctx.restore() or {"i": 0}
    os.makedirs("out", exist_ok=True)
    with open("out/records.jsonl", "a") as f:
        while state["i"] < ctx.params["n"]:
            f.write(json.dumps({"id": state["i"]}) + "\n")
            f.flush()
            state["i"] += 1
            time.sleep(ctx.params["sleep"])
            if ctx.checkpoint_due(state["i"]):
                ctx.checkpoint(state)
    return {"n": state["i"]}
