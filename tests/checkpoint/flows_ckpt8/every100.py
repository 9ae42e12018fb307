"""checkpoint_every_steps=100 in a real flow (issue 8, 1.9 and 1.12).

The counter runs 1..n. On its first attempt it fails at ``fail_at`` (after the
checkpoint at 100 committed), so the second attempt restores and continues: the
checkpoints must land at 100, 200, 300 whatever the restart. After each
``checkpoint(durable=True)`` the step reads the store: durable means the
checkpoint is committed when the call returns.
"""

import os

from segue import Flow
from segue.home import Home

flow = Flow("every100", params={"n": 350, "fail_at": 150})


@flow.step(retries=1, checkpoint_every_steps=100, keep_checkpoints=10)
def count(ctx):
    store = Home.resolve(os.environ["SEGUE_HOME"]).open_store()
    state = ctx.restore() or {"i": 0, "fired": [], "committed_on_return": []}
    while state["i"] < ctx.params["n"]:
        state["i"] += 1
        if ctx.attempt == 1 and state["i"] == ctx.params["fail_at"]:
            raise RuntimeError("planned failure after the first checkpoint")
        if ctx.checkpoint_due(state["i"]):
            state["fired"].append(state["i"])
            ctx.checkpoint(state, position={"i": state["i"]}, durable=True)
            positions = [c.position["i"] for c in store.list_checkpoints(ctx.run_id, ctx.step)]
            state["committed_on_return"].append(max(positions))
    return {"fired": state["fired"], "committed_on_return": state["committed_on_return"]}
