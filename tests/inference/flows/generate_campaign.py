"""A generate step for the kill campaign: prompts (JSONL) -> TransformersGenerateHandler -> JSONL.

Set in the environment (read when the flow loads; the controller, the step and its
sub-workers inherit it): ``GENCAMP`` = JSON with the model's ``path``, ``workers``,
``hold`` and ``hold_id`` (a batch holding that prompt waits until the file ``hold``
exists, and says so with ``HOLD.held-pidPID`` for the campaign's progress gate), and
``kw``, the handler's keywords.
"""

import json
import os
import time

from segue import Flow
from segue.data import JsonlSink, JsonlSource
from segue.inference.handlers import TransformersGenerateHandler

CFG = json.loads(os.environ["GENCAMP"])
HOLD, HOLD_ID = CFG.get("hold", ""), CFG.get("hold_id")

flow = Flow("gen_campaign", params={"prompts": "", "out": ""})
llm = TransformersGenerateHandler(CFG["path"], name="tiny-llama", version="1", device="cpu", **CFG["kw"])


@flow.map(source=lambda ctx: JsonlSource(ctx.params["prompts"]),
          sink=lambda ctx: JsonlSink(ctx.params["out"]), model=llm, workers=int(CFG["workers"]),
          retries=10_000, checkpoint_every="100ms")
def generate(batch, model):
    if HOLD and any(r.get("id") == HOLD_ID for r in batch):
        for pid in {os.getpid(), os.getppid()}:  # workers=1: the step itself; else its coordinator
            open(f"{HOLD}.held-pid{pid}", "w").close()
        while not os.path.exists(HOLD):
            time.sleep(0.01)
    return model(batch)
