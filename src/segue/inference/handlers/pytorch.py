"""PytorchModelHandler: a ``torch.nn.Module`` built from its class, weights from a safetensors file."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import UsageError
from ..handler import ModelHandler
from ._files import existing, files_identity


class PytorchModelHandler(ModelHandler[Any]):
    """``model_class(**model_params)``, with ``weights`` (a safetensors file, never a pickle)
    loaded strictly, moved to the device, in eval mode.

    ``model_class`` is a class (or any function returning a module) or the
    string ``"module:Name"``, imported only when the model loads (so a flow file
    that declares the handler does not import torch).

    ``run_inference`` stacks the batch into one tensor (records are arrays or
    lists of numbers) and returns one NumPy row per record; give ``inference_fn``
    (``fn(model, batch, device) -> sequence``) for anything else.
    """

    def __init__(self, model_class: Callable[..., Any] | str, *, weights: str | os.PathLike[str] | None = None,
                 model_params: Mapping[str, Any] | None = None,
                 inference_fn: Callable[[Any, Sequence[Any], str], Sequence[Any]] | None = None,
                 dtype: str | None = None, **options: Any) -> None:
        if isinstance(model_class, str) and ":" not in model_class:
            raise UsageError(f"model_class {model_class!r} must be a class or 'module:Name'")
        default = model_class.rsplit(":", 1)[1] if isinstance(model_class, str) else None
        options.setdefault("name", default or getattr(model_class, "__name__", "torch-model"))
        super().__init__(**options)
        self.model_class = model_class
        # A "module:Name" next to the flow file is importable while the flow loads, not
        # later when the model loads: remember where the module lives now.
        self._module_dir = _module_dir(model_class) if isinstance(model_class, str) else None
        self.weights = None if weights is None else existing(weights, f"handler {self.name!r}: weights")
        self.model_params = dict(model_params or {})
        self.inference_fn = inference_fn
        self.dtype = dtype

    def load_model(self) -> Any:
        import torch

        model = self._class()(**self.model_params)
        if self.weights is not None:
            from safetensors.torch import load_file

            model.load_state_dict(load_file(str(self.weights)), strict=True)
        if self.dtype is not None:
            model = model.to(getattr(torch, self.dtype))
        return model.to(self.resolve_device()).eval()

    def run_inference(self, batch: Sequence[Any], model: Any) -> Sequence[Any]:
        import numpy as np
        import torch

        device = self.resolve_device()
        if self.inference_fn is not None:
            return self.inference_fn(model, batch, device)
        x = torch.as_tensor(np.asarray(batch), device=device)
        if x.is_floating_point():  # features in the model's own float type (float64 lists included)
            first = next(model.parameters(), None)
            x = x.to(first.dtype if first is not None else torch.float32)
        with torch.inference_mode():
            out = model(x)
        return list(out.float().cpu().numpy())

    def _class(self) -> Callable[..., Any]:
        if not isinstance(self.model_class, str):
            return self.model_class
        module, _, attr = self.model_class.partition(":")
        if self._module_dir and self._module_dir not in sys.path:
            sys.path.append(self._module_dir)
        try:
            return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"handler {self.name!r}: cannot import model_class {self.model_class!r} "
                             f"({exc})") from None

    def config(self) -> dict[str, Any]:
        cls = self.model_class
        where = cls if isinstance(cls, str) else f"{cls.__module__}:{getattr(cls, '__qualname__', '')}"
        return {"class": where,
                "params": self.model_params, "dtype": self.dtype,
                "weights": None if self.weights is None else files_identity(self.weights)}


def _module_dir(spec: str) -> str | None:
    """The sys.path entry a top-level ``module:Name`` is found under now, without importing it."""
    module = spec.partition(":")[0]
    if "." in module:
        return None  # a package module: importable by its package, as any other
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not os.path.isfile(found.origin):
        return None
    return os.path.dirname(found.origin)
