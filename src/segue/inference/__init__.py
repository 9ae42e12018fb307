"""Batch inference: model handlers for data steps, the GPU memory planner, model benchmarks.

- :mod:`segue.inference.handler`: :class:`ModelHandler`, what a data step needs to
  load a model once per attempt, batch records into it and let the device go on pause.
- :mod:`segue.inference.handlers`: ready handlers (PyTorch module, Hugging Face
  ``transformers``, ``sentence-transformers``, ONNX Runtime), imported lazily.
- :mod:`segue.inference.plan`: the GPU memory planner behind ``segue plan``.

Nothing heavy is imported here: torch, transformers and onnxruntime load only
when a handler loads its model.
"""

from __future__ import annotations

from .handler import Loaded, ModelHandler

__all__ = ["Loaded", "ModelHandler"]
