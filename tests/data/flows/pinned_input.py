"""A declared data step (JSONL in, uppercase, JSONL out) for the input checks at resume.

``PINNED_WORKERS`` in the environment (read when the flow loads): 1 (default)
or 2 sub-workers. A record may carry "sleep" (seconds of work, so a checkpoint
is due by the end of the first read batch) and "hold" (a path: the record waits
until it exists, so the run cannot finish before the test parks it).
"""

import os
import time

from segue import Flow
from segue.data import JsonlSink, JsonlSource

flow = Flow("pinned", params={"input": "", "out": ""})


@flow.map(
    source=lambda ctx: JsonlSource(ctx.params["input"], shard_bytes=40_000),
    sink=lambda ctx: JsonlSink(ctx.params["out"]),
    workers=int(os.environ.get("PINNED_WORKERS", "1")),
    retries=3,
    checkpoint_every="100ms",
)
def upper(record):
    if record.get("sleep"):
        time.sleep(record["sleep"])
    while record.get("hold") and not os.path.exists(record["hold"]):
        time.sleep(0.01)
    return {"k": record["k"], "v": record["v"].upper()}
