"""The flow measured by benchmarks.generate: prompts (JSONL) -> a causal LM, greedy -> Parquet.

One ``@flow.map(model=...)`` step with ``TransformersGenerateHandler`` on the
CPU. The model directory, batch size, new tokens and checkpoint interval come
from the environment the benchmark sets (``BENCH_GEN_MODEL``,
``BENCH_GEN_BATCH``, ``BENCH_GEN_TOKENS``, ``BENCH_GEN_CHUNK``), so every side
of the benchmark runs the same model at the same batch.

Probes, off unless ``probe`` is set (a directory): every time the handler
hands the step the batch's tokens so far (at each checkpoint offer, every
``checkpoint_tokens`` tokens, and at the batch's end) the process rewrites
``tokens-PID``: the tokens it generated itself (restored ones not counted).
Summed over the attempts and less the tokens published, that is the number of
tokens generated twice. Once the process is inside its second batch it writes
``mid``: the pause measurement pauses the run there, in the middle of a
generation.
"""

import json
import os
import time
from typing import Any

from pause_gate import write_atomic_text

from segue import Flow
from segue.data import JsonlSource, ParquetSink
from segue.inference.handlers import TransformersGenerateHandler
from segue.inference.testing import TokenCount

flow = Flow("bench_generate", params={"input": "", "out": "", "probe": ""})

llm = TransformersGenerateHandler(
    os.environ["BENCH_GEN_MODEL"], name="bench-llm", version="1",
    batch_size=int(os.environ.get("BENCH_GEN_BATCH", "16")),
    max_new_tokens=int(os.environ.get("BENCH_GEN_TOKENS", "64")),
    checkpoint_tokens=int(os.environ.get("BENCH_GEN_CHUNK", "16")), device="cpu")

class TokenProbe(TokenCount):
    """Counts the tokens this process generated; marks ``mid`` once a second batch began."""

    def counted(self, made: dict[str, int]) -> None:
        if len(made) >= 2 and not os.path.exists(os.path.join(self.where, "mid")):
            write_atomic_text(self.where, "mid", json.dumps({"t": time.time(), "pid": os.getpid()}))


def _source(ctx: Any) -> JsonlSource:
    # one shard: the batches are the plain loop's (consecutive prompts, full but the last)
    return JsonlSource(ctx.params["input"], shard_bytes=1 << 40)


def _sink(ctx: Any) -> ParquetSink:
    return ParquetSink(ctx.params["out"])


@flow.map(source=_source, sink=_sink, model=llm, retries=3, checkpoint_every="2s")
def generate(batch: list[dict[str, Any]], model: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    TokenProbe.attach(model, params["probe"])
    return [{"id": c["id"], "token_ids": c["token_ids"], "text": c["text"],
             "finish_reason": c["finish_reason"]} for c in model(batch)]
