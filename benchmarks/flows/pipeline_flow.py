"""The flow measured by benchmarks.pipeline: JSONL records -> transform -> JSONL, exactly once.

One `@flow.map` step over `input` (a file, a directory or a glob), written by
the exactly-once JsonlSink into `out`, checkpointing every second (durable:
sink parts fsynced, then the checkpoint, then the publish).

The sub-worker count is a decorator argument, fixed when the file is loaded,
so the benchmark picks it with SEGUE_BENCH_WORKERS (the sub-workers load this
file again and inherit the variable).

Two probes for the resume benchmark, both off unless `probe` is set: the first
record a process transforms writes `first-PID` (wall time, peak RSS), and the
record whose id is `hold_at` waits for the pause signal (SIGUSR1, sent by the
controller on `segue pause`) before returning, so the pause lands right there
whatever the machine's speed.
"""

import json
import os
import resource
import time
from typing import Any

from pause_gate import hold_for_pause, write_atomic_text

from segue import Flow
from segue.data import JsonlSink, JsonlSource

WORKERS = int(os.environ.get("SEGUE_BENCH_WORKERS", "1"))

flow = Flow("bench_pipeline", params={"input": "", "out": "", "probe": "", "hold_at": -1})
_probe: dict[str, Any] = {"dir": "", "hold_at": -1, "seen": True}


def _source(ctx: Any) -> JsonlSource:
    # Called once per process before any record: arm the probes from the params.
    _probe.update(dir=ctx.params["probe"], hold_at=int(ctx.params["hold_at"]),
                  seen=not ctx.params["probe"])
    return JsonlSource(ctx.params["input"])


def _write_probe(name: str, body: dict[str, Any]) -> None:
    write_atomic_text(_probe["dir"], name, json.dumps(body))


def _first_record() -> None:
    _probe["seen"] = True
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _write_probe(f"first-{os.getpid()}", {"t": time.time(), "rss_mb": rss_mb})


def transform(r: dict[str, Any]) -> dict[str, Any]:
    t = r["text"]
    return {"id": r["id"], "text": t.upper(), "len": len(t), "score": r["x"] * 2.0 + 1.0,
            "tag": r["tag"]}


@flow.map(source=_source, sink=lambda ctx: JsonlSink(ctx.params["out"]),
          workers=WORKERS, retries=3, checkpoint_every="1s")
def records(r: dict[str, Any]) -> dict[str, Any]:
    if not _probe["seen"]:
        _first_record()
    if r["id"] == _probe["hold_at"]:
        hold_for_pause(lambda: _write_probe("held", {"t": time.time(), "pid": os.getpid()}))
    return transform(r)
