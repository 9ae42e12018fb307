"""The nightly generation job: a corpus of prompts -> a causal LM -> Parquet, exactly once.

Each prompt record (``{"id", "prompt"}``) gives one completion record: its
token ids, text and finish reason, published once with the checkpoint that
covers it. The step asks for a whole GPU at batch priority (the demo submits
it so): an urgent run may preempt it. It then parks at the next checkpoint
offer, between two tokens of the batch in flight (every 16 tokens), gives the
device back, and resumes by itself: the next attempt reloads the model,
re-prefills each unfinished request with its prompt and the tokens it had,
and goes on. ``probe`` (a directory, optional) counts the tokens each attempt
generated (``llm.TokenCount``).

    segue run examples/llm_nightly.py -p prompts=prompts.jsonl -p out=completions/
"""

import os
import time

from llm import count_tokens, handler

from segue import Flow
from segue.data import JsonlSource, ParquetSink

flow = Flow("nightly_generate", params={"prompts": "", "out": "", "probe": ""})
llm = handler(gpus=1)
# For the demo's test only: a batch holding prompt SEGUE_DEMO_HOLD_AT or later waits for the
# file SEGUE_DEMO_HOLD, which the demo writes once the preemption was asked for, so the job
# cannot finish before it is preempted however fast the machine is.
HOLD, HOLD_AT = os.environ.get("SEGUE_DEMO_HOLD", ""), int(os.environ.get("SEGUE_DEMO_HOLD_AT") or 0)


@flow.map(source=lambda ctx: JsonlSource(ctx.params["prompts"], shard_bytes=1 << 40),
          sink=lambda ctx: ParquetSink(ctx.params["out"]), model=llm, retries=3, checkpoint_every="2s")
def generate(batch, model, params):
    if HOLD and any(isinstance(r, dict) and int(r.get("id", -1)) >= HOLD_AT for r in batch):
        while not os.path.exists(HOLD):
            time.sleep(0.01)
    count_tokens(model, params["probe"])
    return [c if not isinstance(c, dict) else
            {"id": c["id"], "token_ids": c["token_ids"], "text": c["text"], "finish_reason": c["finish_reason"]}
            for c in model(batch)]
