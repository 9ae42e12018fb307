"""ModelHandler: how a data step loads a model once per attempt and runs batches through it.

A handler is a small declarative object, like Beam's ``ModelHandler``: it knows
how to load its model (:meth:`ModelHandler.load_model`), how to run a batch
(:meth:`ModelHandler.run_inference`), how to let the device go
(:meth:`ModelHandler.release`), and what it needs (resource hints). Its name,
version and configuration are part of the run's code fingerprint, so a run
never resumes with another model than the one it started with.

Batches are consecutive records of one input shard, cut at fixed positions
(``max_batch_size`` records, fewer only at a shard's end), never by time: an
interrupted and resumed run feeds the model exactly the batches an
uninterrupted one does, so a deterministic model gives bit-identical outputs
(padding to the longest text of a batch, for one, depends on the batch).

Nothing heavy is imported at module level: each handler imports its library
in :meth:`load_model`.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from ..errors import UsageError
from ..flow.model import parse_memory
from .loaded import AUTO as AUTO
from .loaded import Loaded as Loaded
from .loaded import ModelLoadError as ModelLoadError

M = TypeVar("M")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ModelHandler(abc.ABC, Generic[M]):
    """Load a model once per attempt and run batches of records through it.

    Subclasses implement :meth:`load_model` and :meth:`run_inference`; they may
    override :meth:`release` (free device memory) and :meth:`config` (what else
    identifies the model, for the fingerprint).

    Batching: ``max_batch_size`` records per call (``batch_size`` is its alias;
    ``"auto"`` takes the batch that ``segue bench-model`` recommended for this
    handler on this device type). ``min_batch_size`` is the smallest batch the
    model accepts: only a shard's last batch may be smaller, and a model that
    cannot take it must pad. ``max_batch_wait_s`` bounds how long a partial
    batch may wait for records; segue's sources read whole batches, so a batch
    never waits (the bound is kept for sources that trickle).

    Resource hints (``gpus``, ``gpu_memory``, ``memory``, ``accelerator``)
    become the step's defaults; a keyword given to ``@flow.map`` wins.
    """

    name: str = ""
    version: str = "1"

    def __init__(
        self,
        *,
        name: str | None = None,
        version: str | None = None,
        batch_size: int | str | None = None,
        min_batch_size: int = 1,
        max_batch_size: int | str | None = None,
        max_batch_wait_s: float | None = None,
        device: str = AUTO,
        gpus: int | None = None,
        gpu_memory: str | int | None = None,
        memory: str | int | None = None,
        accelerator: str | None = None,
    ) -> None:
        self.name = name or self.name or type(self).__name__
        self.version = str(version if version is not None else self.version)
        if not _NAME.match(self.name):
            raise UsageError(f"model handler name {self.name!r} must be 1-128 letters, digits, '.', '_' or '-'")
        if batch_size is not None and max_batch_size is not None and batch_size != max_batch_size:
            raise UsageError("give batch_size or max_batch_size, not both (batch_size is max_batch_size)")
        size = max_batch_size if max_batch_size is not None else batch_size
        self.max_batch_size: int | str = 32 if size is None else size
        if self.max_batch_size != AUTO and (not _is_int(self.max_batch_size) or int(self.max_batch_size) < 1):
            raise UsageError(f"handler {self.name!r}: max_batch_size must be an int >= 1 or 'auto', "
                             f"not {self.max_batch_size!r}")
        if not _is_int(min_batch_size) or min_batch_size < 1:
            raise UsageError(f"handler {self.name!r}: min_batch_size must be an int >= 1, not {min_batch_size!r}")
        if _is_int(self.max_batch_size) and min_batch_size > int(self.max_batch_size):
            raise UsageError(f"handler {self.name!r}: min_batch_size {min_batch_size} is above "
                             f"max_batch_size {self.max_batch_size}")
        self.min_batch_size = min_batch_size
        if max_batch_wait_s is not None and not (isinstance(max_batch_wait_s, int | float)
                                                 and max_batch_wait_s >= 0):
            raise UsageError(f"handler {self.name!r}: max_batch_wait_s must be a number >= 0")
        self.max_batch_wait_s = max_batch_wait_s
        if not isinstance(device, str) or not re.match(r"^(auto|cpu|cuda(:\d+)?|mps)$", device):
            raise UsageError(f"handler {self.name!r}: device must be auto, cpu, cuda, cuda:N or mps, "
                             f"not {device!r}")
        self.device = device
        if gpus is not None and (not _is_int(gpus) or gpus < 0):
            raise UsageError(f"handler {self.name!r}: gpus must be an int >= 0, not {gpus!r}")
        self.gpus = gpus
        self.gpu_memory = parse_memory(gpu_memory, f"handler {self.name!r}: gpu_memory")
        self.memory = parse_memory(memory, f"handler {self.name!r}: memory")
        self.accelerator = accelerator

    # -- what a subclass implements -------------------------------------------------
    @abc.abstractmethod
    def load_model(self) -> M:
        """Load the model (onto :meth:`resolve_device`); called once per attempt, on the first batch."""

    @abc.abstractmethod
    def run_inference(self, batch: Sequence[Any], model: M) -> Sequence[Any]:
        """The model's outputs for ``batch``, one per input, in order."""

    def release(self, model: M) -> None:
        """Let the device go: drop references and return cached device memory.

        Called before the attempt ends (a pause, a preemption, the step's end),
        so a paused run holds no device memory. The default empties PyTorch's
        CUDA cache when torch is loaded.
        """
        del model
        free_torch_cuda_cache()

    def config(self) -> dict[str, Any]:
        """What identifies the model beyond name and version (paths, dtypes...), as JSON."""
        return {}

    def model_bytes(self, model: M) -> int | None:
        """The model's parameter bytes, when known (reported with each load)."""
        return torch_parameter_bytes(model)

    # -- provided -------------------------------------------------------------------
    def resolve_device(self) -> str:
        """``device``, with ``auto`` resolved: CUDA when torch sees a device, else CPU."""
        if self.device != AUTO:
            return self.device
        try:
            import torch
        except ImportError:
            return "cpu"
        return "cuda" if torch.cuda.is_available() else "cpu"

    def identity(self) -> dict[str, Any]:
        """Name, version, class and configuration: part of the run's code fingerprint."""
        return {"name": self.name, "version": self.version,
                "class": f"{type(self).__module__}.{type(self).__qualname__}",
                "max_batch_size": self.max_batch_size, "min_batch_size": self.min_batch_size,
                "config": self.config()}

    def session(self, fn: Any, ctx: Any) -> Any:
        """A :class:`~segue.inference.session.ModelSession` of ``fn`` for the attempt of ``ctx``."""
        from .session import ModelSession

        return ModelSession(self, fn, ctx)

    def hints(self) -> dict[str, Any]:
        """The resource hints that are set, as ``@flow.step`` keywords."""
        out: dict[str, Any] = {}
        for key in ("gpus", "gpu_memory", "memory", "accelerator"):
            v = getattr(self, key)
            if v is not None:
                out[key] = v
        return out

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}@{self.version} batch={self.max_batch_size}>"


def free_torch_cuda_cache() -> None:
    """Return PyTorch's cached CUDA memory to the driver, if torch is loaded and sees CUDA."""
    import gc
    import sys

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def torch_parameter_bytes(model: Any) -> int | None:
    """Bytes of a torch module's parameters and buffers (None for anything else)."""
    params = getattr(model, "parameters", None)
    buffers = getattr(model, "buffers", None)
    if not callable(params):
        return None
    try:
        n = sum(p.numel() * p.element_size() for p in params())
        if callable(buffers):
            n += sum(b.numel() * b.element_size() for b in buffers())
        return int(n)
    except (AttributeError, TypeError):
        return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
