"""The flow measured by benchmarks.cluster's failover: JSONL records -> JSONL, exactly once.

Each record costs TICK seconds (it stands for a unit of work), so the step is
still running when its host dies; it checkpoints every second.
"""

import time

from segue import Flow
from segue.data import JsonlSink, JsonlSource

TICK = 0.002
flow = Flow("bench_cluster", params={"input": "", "out": ""})


@flow.map(source=lambda ctx: JsonlSource(ctx.params["input"]), sink=lambda ctx: JsonlSink(ctx.params["out"]),
          retries=5, checkpoint_every="1s")
def tag(r):
    time.sleep(TICK)
    return {"k": r["k"], "text": r["text"].upper()}
