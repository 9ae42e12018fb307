"""OnnxModelHandler: an ``.onnx`` file on ONNX Runtime (CUDA provider when the device is a GPU)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..handler import ModelHandler
from ._files import existing, files_identity


class OnnxModelHandler(ModelHandler[Any]):
    """An ONNX Runtime session over ``path``; the batch is stacked into the first input.

    ``input_name``/``output_name`` default to the model's first input and
    output; ``dtype`` is the NumPy type the input is cast to. Outputs are one
    NumPy row per record. ``release`` drops the session (ONNX Runtime returns
    its arena when the session goes).
    """

    def __init__(self, path: str | os.PathLike[str], *, input_name: str | None = None,
                 output_name: str | None = None, dtype: str = "float32", **options: Any) -> None:
        options.setdefault("name", "onnx")
        super().__init__(**options)
        self.path = existing(path, f"handler {self.name!r}: path")
        self.input_name, self.output_name, self.dtype = input_name, output_name, dtype

    def resolve_device(self) -> str:
        if self.device != "auto":
            return self.device
        import onnxruntime as ort

        return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"

    def load_model(self) -> Any:
        import onnxruntime as ort

        providers = ["CPUExecutionProvider"]
        if self.resolve_device().startswith("cuda"):
            providers.insert(0, "CUDAExecutionProvider")
        return ort.InferenceSession(str(self.path), providers=providers)

    def run_inference(self, batch: Sequence[Any], model: Any) -> Sequence[Any]:
        import numpy as np

        name = self.input_name or model.get_inputs()[0].name
        out = self.output_name or model.get_outputs()[0].name
        x = np.asarray(batch, dtype=self.dtype)
        return list(model.run([out], {name: x})[0])

    def model_bytes(self, model: Any) -> int | None:
        return self.path.stat().st_size

    def config(self) -> dict[str, Any]:
        return {"file": files_identity(self.path), "input": self.input_name, "output": self.output_name,
                "dtype": self.dtype}
