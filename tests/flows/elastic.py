"""An elastic map step for scheduler tests: ``workers=(1, 3)``, one GPU per sub-worker.

Each output row names the devices its sub-worker saw (``CUDA_VISIBLE_DEVICES``)
and, on Ray, its node.
While the file ``$ELASTIC_SLOW_FILE`` exists, every record takes at least
``$ELASTIC_DELAY`` seconds: a lower bound on how long the run lasts, so the
test, not the machine's speed, decides when it may finish (it deletes the
file). Never a block: a sub-worker must keep answering checkpoint barriers.
"""

import os
import time

from segue import Flow
from segue.data import JsonlSink, SequenceSource

flow = Flow("elastic", params={"n": 3000, "shards": 12, "out": "out"})


@flow.map(
    source=lambda ctx: SequenceSource(list(range(ctx.params["n"])), shards=ctx.params["shards"]),
    sink=lambda ctx: JsonlSink(ctx.params["out"]),
    workers=(1, 3),
    gpus=1,
    cpus=0.5,
    retries=20,
    checkpoint_every="300ms",
)
def square(k):
    slow = os.environ.get("ELASTIC_SLOW_FILE", "")
    if slow and os.path.exists(slow):
        time.sleep(float(os.environ.get("ELASTIC_DELAY", "0.02")))
    return {"k": k, "v": k * k, "dev": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "node": os.environ.get("SEGUE_RAY_NODE_ID", "")}  # on Ray: the sub-worker's node
