"""What a model session holds: the loaded model as the step function calls it, and its load error.

Apart from ``inference.handler`` (whose ``ModelHandler.session`` builds the
session) so ``inference.session`` imports it without importing the handler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..errors import SegueError

if TYPE_CHECKING:
    from .handler import ModelHandler

M = TypeVar("M")
AUTO = "auto"


class ModelLoadError(SegueError):
    """The model could not be loaded: the attempt fails (and retries); no record is dead-lettered."""

    segue_fatal = True  # the data layer re-raises it instead of dead-lettering the batch
    segue_retryable = True  # set per cause: a missing file or module is not worth a retry


class Loaded(Generic[M]):
    """A loaded model as the step function sees it: call it on a batch.

    ``model(batch)`` is ``handler.run_inference(batch, model.raw)``; ``raw`` is
    the library's own object, for anything else.
    """

    __slots__ = ("handler", "raw", "device", "unit")

    def __init__(self, handler: ModelHandler[M], raw: M, device: str) -> None:
        self.handler, self.raw, self.device = handler, raw, device
        self.unit: Any = None  # the data step's batch in flight (inference.unit.UnitState), if any

    def __call__(self, batch: Sequence[Any]) -> Sequence[Any]:
        resumable = getattr(self.handler, "run_resumable", None)  # a generate handler
        if resumable is not None:
            out = resumable(batch, self.raw, self.unit)
        else:
            out = self.handler.run_inference(batch, self.raw)
        if len(out) != len(batch):
            raise ValueError(f"handler {self.handler.name!r} returned {len(out)} outputs "
                             f"for a batch of {len(batch)}; run_inference must return one per input")
        return out
