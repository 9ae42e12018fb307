"""Batch generation as a resumable data step: prompts (JSONL) -> a causal LM -> completions (JSONL).

The model is the tiny random Llama that ``segue.inference.testing.tiny_causal_lm``
writes (built on first use under ``models/tiny-llama``; nothing is downloaded),
so its text is noise; point ``SEGUE_GEN_MODEL`` at a real causal LM directory
for words. Each prompt record needs an ``id`` and a ``prompt``; each completion
is published once, with the checkpoint that covers it, and a long completion
cut by a pause or a crash goes on from its checkpointed tokens.

    python -c "import json; [print(json.dumps({'id': i, 'prompt': f'question {i}:'})) for i in range(20)]" > prompts.jsonl
    segue run examples/generate_flow.py -p prompts=prompts.jsonl -p out=completions/
"""

import os
from pathlib import Path

from segue import Flow
from segue.data import JsonlSink, JsonlSource
from segue.inference.handlers import TransformersGenerateHandler
from segue.inference.testing import tiny_causal_lm

MODEL = Path(os.environ.get("SEGUE_GEN_MODEL", "models/tiny-llama"))
if not (MODEL / "config.json").exists():
    tiny_causal_lm(MODEL, seed=0)  # deterministic: every process that builds it gets the same files

flow = Flow("generate", params={"prompts": "", "out": ""})

llm = TransformersGenerateHandler(MODEL, name="tiny-llama", version="1", batch_size=8, max_new_tokens=32,
                                  temperature=0.8, top_p=0.95, seed=1234, stop=["\n\n"],
                                  checkpoint_tokens=8, device="auto")


@flow.map(source=lambda ctx: JsonlSource(ctx.params["prompts"]),
          sink=lambda ctx: JsonlSink(ctx.params["out"]), model=llm, retries=3, checkpoint_every="2s")
def generate(batch, model):
    return model(batch)  # one completion record per prompt: id, text, token_ids, finish_reason, counts
