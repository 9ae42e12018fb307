"""A data step whose input directory grows while the run is paused (``--on-input-change include-new``).

JSONL in, uppercase, JSONL out. Set in the environment (the controller, the
step's process and its sub-workers inherit it; read when the flow loads):

* ``MAPGROW_WORKERS``: ``1``, ``2`` or ``1-2`` (elastic);
* ``MAPGROW_GATES=K:PATH,K:PATH`` with ``MAPGROW_HOLD=HOLD``: the record with
  key K waits until PATH exists, and says so with ``HOLD.held-pidPID`` for the
  campaign's progress gate (PID: the step's process, which is a sub-worker's
  parent). A test gates the last record of each input file on the next file
  and the last one on HOLD, so the run cannot finish before every file was
  added and every fault landed, however fast or slow the machine is.
"""

import os
import time

from segue import Flow
from segue.data import JsonlSink, JsonlSource

_W = os.environ.get("MAPGROW_WORKERS", "1")
GATES = {int(k): path for k, path in (g.split(":", 1) for g in os.environ.get("MAPGROW_GATES", "").split(",") if g)}
HOLD = os.environ.get("MAPGROW_HOLD", "")

flow = Flow("mapgrow", params={"input": "", "out": "", "shard_bytes": 40_000})


@flow.map(
    source=lambda ctx: JsonlSource(ctx.params["input"], shard_bytes=ctx.params["shard_bytes"]),
    sink=lambda ctx: JsonlSink(ctx.params["out"]),
    workers=(1, 2) if _W == "1-2" else int(_W),
    retries=200,
    checkpoint_every="100ms",
)
def grow(record):
    path = GATES.get(record["k"])
    if path:
        for pid in {os.getpid(), os.getppid()}:  # workers=1: the step itself; else its coordinator
            open(f"{HOLD}.held-pid{pid}", "w").close()
        while not os.path.exists(path):
            time.sleep(0.01)
    if record["k"] % 16 == 0:
        time.sleep(0.001)  # stands for real work, so checkpoints land between faults
    return {"k": record["k"], "v": record["v"].upper()}
