"""TransformersHandler: a Hugging Face ``transformers`` model and tokenizer from a local directory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ...errors import UsageError
from ..handler import ModelHandler
from ._files import existing, files_identity

TASKS = ("embed", "classify")


class TransformersHandler(ModelHandler[Any]):
    """``AutoModel``/``AutoTokenizer`` from ``path`` (offline: ``local_files_only``).

    ``task="embed"``: the attention-masked mean of the last hidden state (or
    the first token's with ``pooling="cls"``), L2-normalised with ``normalize``;
    ``task="classify"``: ``AutoModelForSequenceClassification`` logits. Inputs
    are texts; outputs are float32 NumPy rows. ``max_length`` truncates.
    """

    def __init__(self, path: str | os.PathLike[str], *, task: str = "embed", pooling: str = "mean",
                 normalize: bool = False, max_length: int = 256, dtype: str | None = None,
                 **options: Any) -> None:
        options.setdefault("name", "transformers")
        super().__init__(**options)
        if task not in TASKS:
            raise UsageError(f"handler {self.name!r}: task must be one of {', '.join(TASKS)}, not {task!r}")
        if pooling not in ("mean", "cls"):
            raise UsageError(f"handler {self.name!r}: pooling must be mean or cls, not {pooling!r}")
        self.path = existing(path, f"handler {self.name!r}: path", directory=True)
        self.task, self.pooling, self.normalize = task, pooling, normalize
        self.max_length, self.dtype = max_length, dtype

    def load_model(self) -> Any:
        import torch
        import transformers as tf

        tok = tf.AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        cls = tf.AutoModelForSequenceClassification if self.task == "classify" else tf.AutoModel
        kw = {"dtype": getattr(torch, self.dtype)} if self.dtype else {}
        model = cls.from_pretrained(str(self.path), local_files_only=True, **kw)
        return tok, model.to(self.resolve_device()).eval()

    def run_inference(self, batch: Sequence[Any], model: Any) -> Sequence[Any]:
        import torch

        tok, net = model
        enc = tok(list(batch), padding=True, truncation=True, max_length=self.max_length,
                  return_tensors="pt").to(self.resolve_device())
        with torch.inference_mode():
            out = net(**enc)
            if self.task == "classify":
                vec = out.logits
            elif self.pooling == "cls":
                vec = out.last_hidden_state[:, 0]
            else:
                mask = enc["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
                vec = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            if self.normalize:
                vec = torch.nn.functional.normalize(vec, p=2, dim=1)
        return list(vec.float().cpu().numpy())

    def model_bytes(self, model: Any) -> int | None:
        return super().model_bytes(model[1])

    def config(self) -> dict[str, Any]:
        return {"files": files_identity(self.path), "task": self.task, "pooling": self.pooling,
                "normalize": self.normalize, "max_length": self.max_length, "dtype": self.dtype}
