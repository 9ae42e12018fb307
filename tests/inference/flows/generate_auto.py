"""A generate step with ``batch_size="auto"``: the batch comes from `segue bench-model`'s profile.

The tiny causal LM's directory is ``$SEGUE_TEST_GEN_MODEL``. Each output row
records the size of the batch the function saw (``bs``), so a test can check
that the run used the profile's recommended batch.
"""

import os

from segue import Flow
from segue.data import JsonlSource, ParquetSink
from segue.inference.handlers import TransformersGenerateHandler

flow = Flow("generate_auto", params={"prompts": "", "out": ""})
llm = TransformersGenerateHandler(os.environ["SEGUE_TEST_GEN_MODEL"], name="tiny-llama", version="1",
                                  batch_size="auto", max_new_tokens=8, device="cpu")


@flow.map(source=lambda ctx: JsonlSource(ctx.params["prompts"], shard_bytes=1 << 40),
          sink=lambda ctx: ParquetSink(ctx.params["out"]), model=llm)
def generate(batch, model):
    return [{"id": c["id"], "token_ids": c["token_ids"], "bs": len(batch)} for c in model(batch)]
