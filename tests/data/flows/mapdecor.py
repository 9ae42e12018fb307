"""A data step declared with @flow.map: JSONL in, uppercase, JSONL out.

Records with "bad": true make the function raise, so they go to the
dead-letter sink; past max_failures the step stops.
"""

import time

from segue import Flow
from segue.data import JsonlSink, JsonlSource

flow = Flow("mapdecor", params={"input": "", "out": "out/upper"})


@flow.map(
    source=lambda ctx: JsonlSource(ctx.params["input"], shard_bytes=40_000),
    sink=lambda ctx: JsonlSink(ctx.params["out"]),
    retries=200,
    checkpoint_every="100ms",
    max_failures=5,
)
def upper(record):
    if record.get("sleep"):
        time.sleep(record["sleep"])  # stands for real work per record
    if record.get("bad"):
        raise ValueError(f"record {record['k']} is bad")
    return {"k": record["k"], "v": record["v"].upper()}
