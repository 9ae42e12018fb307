"""A step that checkpoints only when asked: its interval is an hour.

It counts until the file ``gate`` exists, so a test decides when it ends; any
checkpoint it commits before then was asked for (``segue ckpt now``) or is a
pause's.
"""

import os
import time

from segue import Flow

flow = Flow("ondemand", params={"gate": ""})


@flow.step(checkpoint_every="1h")
def loop(ctx):
    i = (ctx.restore() or {"i": 0})["i"]
    while not os.path.exists(ctx.params["gate"]):
        i += 1
        ctx.progress(i)
        if ctx.checkpoint_due(i):
            ctx.checkpoint({"i": i})
        time.sleep(0.005)
    return {"i": i}
