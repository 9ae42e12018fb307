"""A step process's inputs and outputs: the flow file it loads, upstream outputs, its own output.

Shared by the worker and a gang's ranks (``run.gang_rank``), which must not import
each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import checkpoint as ckpt
from ..home import output_path
from ..store.base import Store


def flow_file(run: Any, placed: str | None = None) -> str:
    """The flow file this process loads: the copy of its source that an executor
    placed on this node (``placed``: from the worker's options record, or a rank's
    recipe; see executor.ray_node), else the run's."""
    return placed or run.flow_path


def input_loader(store: Store, storage: ckpt.CheckpointStorage, run_id: str,
                 allow_pickle: bool) -> Callable[[str], Any]:
    """``load(step)``: an upstream step's output, loaded and verified (None if it returned None)."""

    def load(name: str) -> Any:
        ref = store.get_task(run_id, name).output_ref
        if ref is None:
            return None
        return ckpt.load(storage, ref, allow_pickle=allow_pickle).state["value"]

    return load


def save_output(storage: ckpt.CheckpointStorage, run_id: str, step: str, epoch: int, value: Any, *,
                allow_pickle: bool) -> str:
    """Save a step's return value as its output checkpoint; returns the reference."""
    ref = output_path(run_id, step, epoch)
    ckpt.save(storage, ref, {"value": value}, meta={"kind": "output", "run_id": run_id, "step": step,
              "epoch": epoch}, allow_pickle=allow_pickle)
    return ref
