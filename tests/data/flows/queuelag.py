"""A continuous data step for the queue lag and retention tests: a Redis stream or a RabbitMQ
queue -> transform -> JSONL, read until paused or cancelled.

``hold=PATH`` with ``hold_k=K``: the message with key K waits until PATH exists, saying
so with ``PATH.held-EPOCH``: the step has reported its lag after the batch before it
and reads nothing more meanwhile; once PATH exists it also waits until the worker has seen
a pause request (the tests pause it there: the step parks right after that batch's commit,
wherever the controller's signal happened to be). ``retention_s`` (Redis) and ``ttl_s`` (RabbitMQ) state
what the broker keeps (0: not stated).
"""

import os
import time

from segue import Flow
from segue.data import JsonlSink, run_map
from segue.data.sources.rabbitmq import RabbitMQSource
from segue.data.sources.redis_stream import RedisStreamSource

flow = Flow(
    "queuelag",
    params={"url": "", "stream": "", "out": "", "hold": "", "hold_k": -1, "retention_s": 0.0,
            "ttl_s": 0.0, "batch": 50},
)


@flow.step(retries=3)
def consume(ctx):
    p = ctx.params

    def fn(r):
        if p["hold"] and r["k"] == p["hold_k"]:
            open(f"{p['hold']}.held-{ctx.epoch}", "w").close()
            while not os.path.exists(p["hold"]) or not ctx.pause_requested:
                time.sleep(0.01)
        return {"k": r["k"], "v": r["v"].upper()}

    continuous = {"drain_idle_s": None, "drain_after_empty_reads": None, "block_ms": 100}
    if p["url"].startswith("amqp"):
        src = RabbitMQSource(p["url"], p["stream"], prefetch=p["batch"],
                             message_ttl_s=p["ttl_s"] or None, **continuous)
    else:
        src = RedisStreamSource(p["url"], p["stream"], retention_s=p["retention_s"] or None,
                                **continuous)
    return run_map(ctx, src, fn, JsonlSink(p["out"]), read_batch=p["batch"])
