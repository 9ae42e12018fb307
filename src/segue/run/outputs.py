"""Reading a step's return value: ``segue.read_output`` and `segue output`.

A step's output is published as a checkpoint-format directory when its
attempt completes, and the task record names it; this module resolves that
reference and loads it, verified like any checkpoint. It never writes.
"""

from __future__ import annotations

import base64
import math
import os
from typing import Any

from ..errors import NotFoundError, UsageError
from ..home import Home
from ..states import TaskState
from .logs import check_step


def read_output(run_id: str, step: str, home: str | os.PathLike[str] | Home | None = None, *,
                allow_pickle: bool = False) -> Any:
    """The value step ``step`` of run ``run_id`` returned (``None`` if it returned nothing).

    Raises :class:`~segue.UsageError` (one line) for a missing home, an unknown run
    or step, or a step that has not succeeded yet (naming its state). ``home``:
    as ``--home`` (default ``$SEGUE_HOME`` or ``./.segue``). Set ``allow_pickle``
    only for a step declared with ``allow_pickle=True`` whose code you trust.
    """
    from .stepio import load_output  # the checkpoint engine is imported only when needed

    h = home if isinstance(home, Home) else Home.resolve(home)
    if not h.exists():  # reading never creates a home
        raise UsageError(f"no segue home at {h.root}; start a run first or pass --home / SEGUE_HOME")
    store = h.open_store()
    run = store.get_run(run_id)  # UnknownRunError
    tasks = {t.step: t for t in store.get_tasks(run_id)}
    check_step(step)
    if step not in tasks:
        raise NotFoundError(f"run {run_id!r} has no step {step!r}; its steps: {', '.join(tasks)}")
    t = tasks[step]
    if t.state != TaskState.SUCCEEDED:
        raise UsageError(f"step {step!r} of run {run_id!r} has not succeeded yet (it is "
                         f"{t.state.value}); see `segue status {run_id}`")
    return load_output(store, h.run_storage(run), run_id, step, t.output_ref, allow_pickle=allow_pickle)


def to_json(value: Any, where: str = "output") -> Any:
    """A JSON-able copy of an output: arrays and tensors become (nested) lists,
    bytes base64; anything else JSON cannot hold is refused, naming where it is."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # JSON has no NaN or infinity; strings keep the value visible without breaking parsers.
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): to_json(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (bytes, bytearray)):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars, tensors
        tolist = value.detach().cpu().tolist() if hasattr(value, "detach") else value.tolist()
        return to_json(tolist, where)
    raise UsageError(f"{where} is a {type(value).__name__}, which JSON cannot show; "
                     "drop --json, or read it in Python with segue.read_output()")
