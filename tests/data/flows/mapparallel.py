"""A data step over two sub-worker processes: JSONL in, uppercase, JSONL out.

``MAPPARALLEL_HOLD=PATH`` and ``MAPPARALLEL_HOLD_K=K`` in the environment (the
sub-workers inherit it): the record with key K waits until PATH exists, so a
test's faults all land before the run can finish, however fast the machine.
``MAPPARALLEL_WORK_S`` is the time every fourth record takes (0.001 s).
"""

import os
import time

from segue import Flow
from segue.data import JsonlSink, JsonlSource

flow = Flow("mapparallel", params={"input": "", "out": "out", "shard_bytes": 60_000})


@flow.map(
    source=lambda ctx: JsonlSource(ctx.params["input"], shard_bytes=ctx.params["shard_bytes"]),
    sink=lambda ctx: JsonlSink(ctx.params["out"]),
    workers=2,
    retries=200,
    checkpoint_every="200ms",
)
def upper(record):
    hold = os.environ.get("MAPPARALLEL_HOLD")
    if hold and record["k"] == int(os.environ["MAPPARALLEL_HOLD_K"]):
        while not os.path.exists(hold):
            time.sleep(0.01)
    if record["k"] % 4 == 0:
        time.sleep(float(os.environ.get("MAPPARALLEL_WORK_S", "0.001")))  # stands for real work
    return {"k": record["k"], "v": record["v"].upper()}
