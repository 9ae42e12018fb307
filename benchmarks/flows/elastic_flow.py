"""The batch job of benchmarks.elastic: a map step over 3 virtual GPUs, one per sub-worker.

Each record costs ``ELASTIC_BENCH_DELAY`` seconds (standing for a model's batch on
the device). ``ELASTIC_BENCH_WORKERS`` is ``1,3`` (elastic: partial preemption) or
``3`` (a fixed size: preempted whole, as Dataflow and Kueue preempt jobs); every
process of the run reads the same environment.
"""

import os
import time

from segue import Flow
from segue.data import JsonlSink, SequenceSource

_W = [int(x) for x in os.environ.get("ELASTIC_BENCH_WORKERS", "1,3").split(",")]
WORKERS = (_W[0], _W[1]) if len(_W) == 2 else _W[0]
DELAY = float(os.environ.get("ELASTIC_BENCH_DELAY", "0.004"))

flow = Flow("elastic_bench", params={"n": 6000, "shards": 24, "out": "out"})


@flow.map(
    source=lambda ctx: SequenceSource(list(range(ctx.params["n"])), shards=ctx.params["shards"]),
    sink=lambda ctx: JsonlSink(ctx.params["out"]),
    workers=WORKERS,
    gpus=1,
    cpus=0.5,
    retries=20,
    checkpoint_every="500ms",
)
def embed(k):
    time.sleep(DELAY)
    return {"k": k, "v": (k * 2654435761) % 2**32}
