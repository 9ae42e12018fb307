"""ModelSession: one attempt's model, loaded on its first batch and released when the attempt ends.

The data layer calls a session like a ``map_batches`` function; the session
loads the handler's model the first time (never per record or per batch),
hands ``fn(batch, model, params)`` the loaded model, and on :meth:`close`
releases it (a pause parks the step only after its device memory is given
back), recording what a generate handler decoded in the attempt (its
sub-batches' shapes against its KV budget: one event of kind ``generate``).
Every load is recorded: an event on the run (load seconds, bytes, device)
and the run's counters ``model_loads``/``model_load_s``, and for a load
in any attempt after the first, the cold-start cost an interruption caused,
``model_reloads``/``model_reload_s``/``model_reload_bytes`` (docs/accounting.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .loaded import AUTO, Loaded, ModelLoadError

if TYPE_CHECKING:
    from .handler import ModelHandler

log = logging.getLogger("segue.inference")

BatchFn = Callable[[Sequence[Any], Loaded[Any], Mapping[str, Any]], Sequence[Any]]


class ModelSession:
    """``fn`` over batches with the handler's model, loaded once for this attempt."""

    def __init__(self, handler: ModelHandler[Any], fn: BatchFn, ctx: Any) -> None:
        self.handler, self.fn, self.ctx = handler, fn, ctx
        self.params: Mapping[str, Any] = getattr(ctx, "params", {})
        self.loaded: Loaded[Any] | None = None
        self.loads = 0
        self.unit: Any = None  # inference.unit.UnitState of the batch in flight

    def segue_begin_unit(self, resumed: Any, offer: Callable[[Any], None]) -> None:
        """The data driver starts a batch: what a previous attempt saved of it, and how to
        offer a checkpoint inside it (a generate handler does, between tokens)."""
        from ..data.driver import home_dir
        from .unit import UnitState

        self.unit = UnitState(resumed, offer, home_dir(self.ctx))
        if self.loaded is not None:
            self.loaded.unit = self.unit

    def batch_size(self) -> int:
        """Records per batch: the handler's, or with ``"auto"`` its profile's recommendation."""
        size = self.handler.max_batch_size
        if size != AUTO:
            return int(size)
        from ..data.driver import home_dir
        from .profiles import device_type_of, recommended_batch

        return recommended_batch(home_dir(self.ctx), self.handler.name, self.handler.version,
                                 device_type_of(self.handler.resolve_device()))

    def __call__(self, batch: Sequence[Any]) -> Sequence[Any]:
        return self.fn(batch, self.loaded or self.load(), self.params)

    def load(self) -> Loaded[Any]:
        h = self.handler
        device = h.resolve_device()
        t0 = time.perf_counter()
        try:
            raw = h.load_model()
        except Exception as exc:
            err = ModelLoadError(f"handler {h.name!r} could not load its model: {type(exc).__name__}: {exc}")
            # A missing file or module, or a bad configuration, fails the same way again.
            err.segue_retryable = not isinstance(exc, UsageError | ImportError | FileNotFoundError)
            raise err from exc
        seconds = time.perf_counter() - t0
        self.loaded = Loaded(h, raw, device)
        self.loaded.unit = self.unit
        self.loads += 1
        self._record_load(seconds, h.model_bytes(raw), device)
        return self.loaded

    def close(self) -> None:
        """Release the model (and its device memory); the next batch would load it again."""
        if self.loaded is None:
            return
        loaded, self.loaded = self.loaded, None
        before = _cuda_reserved()
        self.handler.release(loaded.raw)
        del loaded
        after = _cuda_reserved()
        if before is not None and after is not None:
            self._event(f"model {self.handler.name} released: device memory reserved "
                        f"{before / 2**20:.0f} MiB -> {after / 2**20:.0f} MiB",
                        {"reserved_before": before, "reserved_after": after})
        report = getattr(self.handler, "segue_batch_report", None)  # a generate handler's sub-batches
        got = report() if callable(report) else None
        if got is not None:
            self._event(got[0], {"handler": self.handler.name, **got[1]}, kind="generate")

    # -- records --------------------------------------------------------------------
    def _record_load(self, seconds: float, nbytes: int | None, device: str) -> None:
        h = self.handler
        attempt = int(getattr(self.ctx, "attempt", 1) or 1)
        reload = attempt > 1
        size = f", {_size(nbytes)}" if nbytes else ""
        why = f" (a reload: attempt {attempt} pays the cold start again)" if reload else ""
        stats = {"model_loads": 1.0, "model_load_s": seconds}
        if reload:
            stats.update({"model_reloads": 1.0, "model_reload_s": seconds,
                          "model_reload_bytes": float(nbytes or 0)})
        self._event(f"model {h.name}@{h.version} loaded on {device} in {seconds:.2f}s{size}{why}",
                    {"handler": h.name, "version": h.version, "device": device, "seconds": round(seconds, 4),
                     "bytes": nbytes, "reload": reload, "attempt": attempt}, stats)

    def _event(self, reason: str, data: dict[str, Any], stats: dict[str, float] | None = None,
               kind: str = "model") -> None:
        log.info("step %s: %s", getattr(self.ctx, "step", "?"), reason)
        record = getattr(self.ctx, "record_event", None)
        if record is not None:  # a step context, or a sub-worker's rebuilt one (data.subworker)
            record(kind, reason, data=data, stats=stats)


def _cuda_reserved() -> int | None:
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_reserved())


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
