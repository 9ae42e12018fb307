"""A data step for the Pub/Sub kill tests: a subscription on the emulator -> transform -> JSONL.

``hold=PATH`` with ``hold_k=K``: the message with key K waits until PATH exists,
saying so with ``PATH.held-EPOCH``, so every planned fault lands before the run
can finish (tests/campaign_kit.py). ``sleep_ms`` slows each record a little so
a pause lands before the hold.
"""

import os
import time

from segue import Flow
from segue.data import JsonlSink, run_map
from segue.data.sources.pubsub import PubSubSource

flow = Flow(
    "pubsubmap",
    params={
        "emulator": "",
        "subscription": "",
        "out": "",
        "sleep_ms": 0,
        "hold": "",
        "hold_k": -1,
        "max_deliveries": 100,
    },
)


@flow.step(retries=10_000, checkpoint_every="100ms")
def consume(ctx):
    p = ctx.params

    def fn(r):
        if p["hold"] and r["k"] == p["hold_k"]:
            open(f"{p['hold']}.held-{ctx.epoch}", "w").close()
            while not os.path.exists(p["hold"]):
                time.sleep(0.01)
        if p["sleep_ms"]:
            time.sleep(p["sleep_ms"] / 1000)
        return {"k": r["k"], "v": r["v"].upper()}

    # Every message is published before the run starts: one empty pull means drained (an
    # attempt after a killed one first waits out the dead one's leases).
    src = PubSubSource(
        p["subscription"],
        emulator_host=p["emulator"],
        drain_after_empty_reads=1,
        block_ms=1000,
        max_outstanding=200,
        max_deliveries=p["max_deliveries"],
    )
    return run_map(ctx, src, fn, JsonlSink(p["out"]), read_batch=50)
