"""The shapes a ``@flow.map`` function may take, checked when the flow loads.

Without a model a function takes its input (a record, or a list of records
for ``map_batches``); with ``model=`` it takes ``(batch, model)``. Either may
also read the run's params: a parameter named ``params`` (positional or
keyword-only) gets them, passed by name; an inference function may also take
them as its third positional argument, whatever its name (the older form).
:func:`map_params` says which; ``segue.data.mapstep`` calls accordingly.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

from ..errors import FlowError

PARAMS = "params"

# What the data layer passes first (segue.data.operators; model=: segue.inference.session).
_MAP_ARG = {"map": "record", "filter": "record", "flat_map": "record", "map_batches": "records"}

HowParams = Literal["positional", "keyword"] | None


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins and C callables)
        return None


def _binds(sig: inspect.Signature, n: int, **kw: Any) -> bool:
    try:
        sig.bind(*range(n), **kw)
    except TypeError:
        return False
    return True


def map_params(fn: Callable[..., Any], model: Any) -> HowParams:
    """How ``fn`` takes the run's params: ``"keyword"`` (a parameter named ``params``
    after its inputs), ``"positional"`` (an inference function's third argument), or
    None (it reads none)."""
    sig = _signature(fn)
    inputs = 1 if model is None else 2
    if sig is None:  # unreadable: as before, an inference function is given three
        return None if model is None else "positional"
    if model is not None and _binds(sig, 3):
        return "positional"
    positional = [p.name for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    p = sig.parameters.get(PARAMS)
    if p is None or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) \
            or PARAMS in positional[:inputs]:  # a first argument named params is the record
        return None
    return "keyword"


def check_map_fn(fn: Callable[..., Any], kind: str, model: Any) -> None:
    """Refuse a map function that cannot take what its step passes: it would fail on every
    record, all of them into the dead-letter sink. A signature Python cannot read passes."""
    sig = _signature(fn)
    if sig is None:
        return
    how = map_params(fn, model)
    inputs = 1 if model is None else 2
    if how == "positional" and _binds(sig, 3) or how == "keyword" and _binds(sig, inputs, params={}) \
            or how is None and _binds(sig, inputs):
        return
    name = getattr(fn, "__name__", None) or repr(fn)
    args = "batch, model" if model is not None else _MAP_ARG[kind]
    what = "an inference function (model=)" if model is not None else f"a {kind} function"
    raise FlowError(f"flow.map: step {name!r} takes {sig} but {what} must take fn({args}), or "
                    f"fn({args}, params) to read the run's params (a parameter named params "
                    f"gets them)")
