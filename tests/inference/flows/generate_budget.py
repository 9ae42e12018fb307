"""A generate step whose handler's keywords come from $SEGUE_TEST_GEN (JSON, with the model's
``path``): prompts (JSONL) -> TransformersGenerateHandler -> completions (JSONL). The tests
run it with and without a KV budget, and with bad handler arguments that submit refuses."""

import json
import os

from segue import Flow
from segue.data import JsonlSink, JsonlSource
from segue.inference.handlers import TransformersGenerateHandler

KW = json.loads(os.environ["SEGUE_TEST_GEN"])
MODEL = KW.pop("path")

flow = Flow("gen_budget", params={"prompts": "", "out": ""})
llm = TransformersGenerateHandler(MODEL, name="tiny-llama", version="1", device="cpu", **KW)


@flow.map(source=lambda ctx: JsonlSource(ctx.params["prompts"]),
          sink=lambda ctx: JsonlSink(ctx.params["out"]), model=llm, checkpoint_every="1s")
def generate(batch, model):
    return model(batch)
