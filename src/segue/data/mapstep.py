"""A declared map step (``@flow.map``): how to build its source, operator and sinks.

:meth:`MapStep.build` is the one place that turns the declaration into
objects, used by the step's process and, for ``workers=N``, by every
sub-worker, which loads the flow file and finds this declaration on the step
function (``segue_map``): the user's function is never pickled.

With a ``model`` (a :class:`segue.inference.ModelHandler`), the function is
``fn(batch, model)`` or ``fn(batch, model, params)`` over batches of the
handler's size, and each process of the attempt loads the model once, on its
first batch. A parameter named ``params`` gets the run's params, passed by
name (:mod:`segue.flow.mapfn`), with or without a model.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..flow.mapfn import map_params
from ..flow.model import use_map_step
from .operators import Operator, operator
from .sinks.base import Sink
from .sources.base import Source


@dataclass(frozen=True)
class MapStep:
    fn: Callable[..., Any]
    source: Any  # a Source, or a function of the step context that builds one
    sink: Any
    kind: str = "map"
    batch_size: int | None = None
    batch_bytes: int | None = None
    dead_letter: Any = None
    max_failures: int | None = 1000
    max_failure_rate: float | None = 0.05
    workers: int | tuple[int, int] = 1
    model: Any = None  # a segue.inference.ModelHandler

    def build(self, ctx: Any) -> tuple[Source, Operator, Sink, Sink | None]:
        src = self.source if isinstance(self.source, Source) else self.source(ctx)
        snk = self.sink if isinstance(self.sink, Sink) else self.sink(ctx)
        d = self.dead_letter
        dead = d if d is None or isinstance(d, Sink) else d(ctx)
        if self.model is not None:
            session = self.model.session(self._inference_fn(), ctx)
            op = operator("map_batches", session, batch_size=session.batch_size())
        else:
            fn = self.fn
            if map_params(fn, None) == "keyword":  # built here and in every sub-worker alike
                fn = functools.partial(fn, params=dict(ctx.params))
            op = operator(self.kind, fn, batch_size=self.batch_size, batch_bytes=self.batch_bytes)
        return src, op, snk, dead

    def _inference_fn(self) -> Callable[[Any, Any, Any], Any]:
        """The function as the model session calls it: ``(batch, model, params)``."""
        fn, how = self.fn, map_params(self.fn, self.model)
        if how == "positional":
            return fn
        if how == "keyword":
            return lambda batch, model, params: fn(batch, model, params=params)
        return lambda batch, model, params: fn(batch, model)

    def run(self, ctx: Any) -> dict[str, Any]:
        from .driver import READ_BATCH, effective_read_batch, home_dir, store_of
        from .runmap import run_map
        from .subworker import Recipe

        src, op, snk, dead = self.build(ctx)
        recipe = None
        if self.workers != 1:
            # load_flow compiles the file under its resolved path: that is co_filename.
            path = os.path.abspath(self.fn.__code__.co_filename)
            recipe = Recipe(ctx.run_id, ctx.step, ctx.epoch, effective_read_batch(op, READ_BATCH),
                            dict(ctx.params), flow_path=path, home=home_dir(ctx), store=store_of(ctx))
        return run_map(ctx, src, op, snk, dead_letter=dead, max_failures=self.max_failures,
                       max_failure_rate=self.max_failure_rate, workers=self.workers, recipe=recipe)


use_map_step(MapStep)
