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


# A fan-out's own output is its items' outputs, in order: its task names them with
# this reference instead of saving a copy (run/paths.py completes it).
GATHER = "gather:"


def gather_ref(items: int) -> str:
    return f"{GATHER}{items}"


def input_loader(store: Store, storage: ckpt.CheckpointStorage, run_id: str,
                 allow_pickle: bool) -> Callable[[str], Any]:
    """``load(step)``: an upstream step's output, loaded and verified (None if it returned None)."""

    def load(name: str) -> Any:
        return load_output(store, storage, run_id, name, store.get_task(run_id, name).output_ref,
                           allow_pickle=allow_pickle)

    return load


def load_output(store: Store, storage: ckpt.CheckpointStorage, run_id: str, step: str, ref: str | None,
                *, allow_pickle: bool) -> Any:
    """The value behind a task's output reference; a fan-out's is the list of its items'."""
    if ref is None:
        return None
    if ref.startswith(GATHER):
        refs = {t.step: t.output_ref for t in store.get_tasks(run_id)}
        return [load_output(store, storage, run_id, f"{step}.{i}", refs[f"{step}.{i}"],
                            allow_pickle=allow_pickle) for i in range(int(ref[len(GATHER):]))]
    return ckpt.load(storage, ref, allow_pickle=allow_pickle).state["value"]


def save_output(storage: ckpt.CheckpointStorage, run_id: str, step: str, epoch: int, value: Any, *,
                allow_pickle: bool, path: dict[str, Any] | None = None) -> str:
    """Save a step's return value as its output checkpoint; returns the reference.

    ``path``: what the step decided for the run's path (``chose``: the branches a
    branch point took; ``until``: whether a loop is done), committed with the value.
    """
    ref = output_path(run_id, step, epoch)
    ckpt.save(storage, ref, {"value": value, **(path or {})}, meta={"kind": "output", "run_id": run_id,
              "step": step, "epoch": epoch}, allow_pickle=allow_pickle)
    return ref
