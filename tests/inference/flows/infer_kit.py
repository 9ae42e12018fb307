"""Shared by the inference test flows: texts in (JSONL), a model, Parquet out, and a gate.

A record is ``{"k": int, "text": str}``. With ``hold=PATH`` and ``hold_k=K`` the
batch holding record K waits until PATH exists, after saying so in
``PATH.held-pidPID`` (a campaign's faults all land before the run can finish).
"""

import os
import time

from segue.data import JsonlSource, ParquetSink

DIM = 16


def source(ctx):
    return JsonlSource(ctx.params["input"], shard_bytes=ctx.params["shard_bytes"])


def sink(ctx):
    return ParquetSink(ctx.params["out"])


def gate(batch, params):
    if params["hold"] and any(r["k"] == params["hold_k"] for r in batch):
        open(f"{params['hold']}.held-pid{os.getpid()}", "w").close()
        while not os.path.exists(params["hold"]):
            time.sleep(0.01)


def features(text):
    """A deterministic 16-float feature vector of a text (the tiny model's input)."""
    v = [0.0] * DIM
    for i, ch in enumerate(text.encode()):
        v[(ch + i) % DIM] += (ch % 7 - 3) / 8.0
    return v
