"""OnnxTextHandler: a text encoder exported to ONNX, run on ONNX Runtime without torch.

The directory holds ``model.onnx`` (inputs ``input_ids``, ``attention_mask``
and, for BERT-style models, ``token_type_ids``; first output the last hidden
state) and the fast tokenizer's ``tokenizer.json``: the layout
:func:`segue.inference.export.export_onnx` writes (and Hugging Face Optimum's).
Loading it imports ``onnxruntime`` and ``tokenizers`` only, which is a worker's
start-up and every reload after a pause: about a second, where torch with
``transformers`` takes several.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ...errors import UsageError
from ..handler import ModelHandler
from ._files import existing, files_identity


class OnnxTextHandler(ModelHandler[Any]):
    """Texts in, float32 NumPy rows out: the attention-masked mean of the last hidden
    state (or the first token's with ``pooling="cls"``), L2-normalised with
    ``normalize``, as :class:`TransformersHandler` computes it."""

    def __init__(self, path: str | os.PathLike[str], *, pooling: str = "mean", normalize: bool = False,
                 max_length: int = 256, threads: int = 0, **options: Any) -> None:
        options.setdefault("name", "onnx-text")
        super().__init__(**options)
        if pooling not in ("mean", "cls"):
            raise UsageError(f"handler {self.name!r}: pooling must be mean or cls, not {pooling!r}")
        self.path = existing(path, f"handler {self.name!r}: path", directory=True)
        for name in ("model.onnx", "tokenizer.json"):
            if not (self.path / name).is_file():
                raise UsageError(f"handler {self.name!r}: {self.path} has no {name}; export the model with "
                                 "segue.inference.export.export_onnx(MODEL_DIR, OUT_DIR)")
        self.pooling, self.normalize, self.max_length, self.threads = pooling, normalize, max_length, threads

    def resolve_device(self) -> str:
        if self.device != "auto":
            return self.device
        import onnxruntime as ort

        return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"

    def load_model(self) -> Any:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        tok.enable_truncation(self.max_length)
        tok.enable_padding()
        opts = ort.SessionOptions()
        if self.threads:
            opts.intra_op_num_threads = self.threads
        providers = ["CPUExecutionProvider"]
        if self.resolve_device().startswith("cuda"):
            providers.insert(0, "CUDAExecutionProvider")
        session = ort.InferenceSession(str(self.path / "model.onnx"), opts, providers=providers)
        return tok, session, {i.name for i in session.get_inputs()}

    def run_inference(self, batch: Sequence[Any], model: Any) -> Sequence[Any]:
        import numpy as np

        tok, session, inputs = model
        enc = tok.encode_batch(list(batch))
        ids = np.asarray([e.ids for e in enc], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in enc], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in inputs:
            feed["token_type_ids"] = np.asarray([e.type_ids for e in enc], dtype=np.int64)
        hidden = session.run(None, feed)[0]
        if self.pooling == "cls":
            vec = hidden[:, 0]
        else:
            m = mask[..., None].astype(hidden.dtype)
            vec = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        if self.normalize:
            vec = vec / np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
        return list(vec.astype(np.float32))

    def model_bytes(self, model: Any) -> int | None:
        return (self.path / "model.onnx").stat().st_size

    def config(self) -> dict[str, Any]:
        return {"files": files_identity(self.path), "pooling": self.pooling, "normalize": self.normalize,
                "max_length": self.max_length, "threads": self.threads}
