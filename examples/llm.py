"""The causal LM of the LLM demo's flows (``make demo-llm``), made here: nothing is downloaded.

A random-initialised Llama (4 layers, hidden 256, a vocabulary of 1,024 BPE
tokens) written once by ``segue.inference.testing.tiny_causal_lm`` into
``examples/.models/demo-llama``; the same arguments write the same bytes, so
every process that builds it gets the same model. Its text is noise: point
``SEGUE_GEN_MODEL`` at a real causal LM directory for words. It runs on torch
(``TransformersGenerateHandler``), on the GPU where there is one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from segue.inference.handlers import TransformersGenerateHandler

MODEL = Path(os.environ.get("SEGUE_GEN_MODEL", Path(__file__).resolve().parent / ".models" / "demo-llama"))
SHAPE = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "vocab": 1024, "seed": 0}
NEW_TOKENS = 64


def model_dir() -> Path:
    """The model's directory, written first if missing (into a temporary sibling, then renamed:
    a process that reads it never sees half a model)."""
    if (MODEL / "config.json").is_file():
        return MODEL
    from segue.inference.testing import tiny_causal_lm

    MODEL.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=MODEL.parent))
    try:
        tiny_causal_lm(tmp / "m", **SHAPE)
        try:
            os.rename(tmp / "m", MODEL)
        except OSError:  # another process renamed its copy first: the same bytes
            if not (MODEL / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return MODEL


def handler(**hints: Any) -> TransformersGenerateHandler:
    """Greedy generation of ``NEW_TOKENS`` tokens, batches of 16, a checkpoint offer every 16 tokens;
    ``hints`` (gpus=...) as given."""
    return TransformersGenerateHandler(model_dir(), name="demo-llama", version="1", batch_size=16,
                                       max_new_tokens=NEW_TOKENS, checkpoint_tokens=16, **hints)


class TokenCount:
    """The batch in flight's state, passed through, counting the tokens this process generated.

    Only the demo needs it, to show what a preemption cost: every time the
    handler hands over the batch's tokens so far (at each checkpoint offer,
    where a pause parks, and at the batch's end) it rewrites ``tokens-PID`` in
    ``where`` with the tokens this process generated itself (restored ones not
    counted). Summed over the attempts, less the tokens published, that is the
    work done twice.
    """

    made: dict[str, int] = {}  # first request id of a batch -> tokens this process generated for it

    def __init__(self, unit: Any, where: str) -> None:
        self.unit, self.where = unit, where
        self.restored = sum(len(v["tokens"]) for v in unit.resumed.values())
        self.key = ""

    def get(self, rid: str) -> Any:
        return self.unit.get(rid)

    def update(self, entries: dict[str, Any]) -> None:
        self.unit.update(entries)
        self.key = self.key or min(entries)
        self.made[self.key] = sum(len(v["tokens"]) for v in self.unit.saved.values()) - self.restored
        tmp = os.path.join(self.where, f".tokens-{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(str(sum(self.made.values())))
        os.replace(tmp, os.path.join(self.where, f"tokens-{os.getpid()}"))

    def offer(self) -> None:
        self.unit.offer()


def count_tokens(model: Any, where: str) -> None:
    """Count the tokens of the batch ``model`` is about to generate (see :class:`TokenCount`)."""
    if where and model.unit is not None and not isinstance(model.unit, TokenCount):
        model.unit = TokenCount(model.unit, where)
