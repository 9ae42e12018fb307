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
from segue.inference.testing import TokenCount

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


def count_tokens(model: Any, where: str) -> None:
    """Count the tokens of the batch ``model`` is about to generate (segue.inference.testing.TokenCount)."""
    TokenCount.attach(model, where)
