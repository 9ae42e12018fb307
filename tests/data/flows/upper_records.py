"""The record function and the source/sink builders shared by the mapdecor and mapslow flows.

A record may carry "sleep" (seconds of simulated work), "bad": true (the
function raises, so the record goes to the dead-letter sink) and "hold": a path
(the function waits until that file exists: a test's gate).
"""

import os
import time

from segue.data import JsonlSink, JsonlSource


def source(ctx):
    return JsonlSource(ctx.params["input"], shard_bytes=40_000)


def sink(ctx):
    return JsonlSink(ctx.params["out"])


def upper_record(record):
    if record.get("sleep"):
        time.sleep(record["sleep"])  # stands for real work per record
    while record.get("hold") and not os.path.exists(record["hold"]):
        time.sleep(0.01)
    if record.get("bad"):
        raise ValueError(f"record {record['k']} is bad")
    return {"k": record["k"], "v": record["v"].upper()}
