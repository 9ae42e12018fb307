"""`segue resume` refuses a data step whose input changed in a way its policy cannot take.

Every checkpoint of a data step holds the snapshot of its input it pinned at
its first start (``state["pin"]``, one key for every ``workers=`` setting);
the step's next start compares the input with it under the run's
``on_input_change`` policy and fails, with no retry that could help, where
the policy cannot go on. Resume makes the same comparison first, for each
unfinished ``@flow.map`` step whose declared source can be built from the run
id and parameters, so that refusal is a one-line exit 2 that writes nothing
(the run stays as it was). A source built inside a step function is only
known to that step: it is checked at its start, as before.
"""

from __future__ import annotations

from typing import Any

from ..errors import CheckpointError, UsageError
from ..flow import LoadedFlow
from ..home import Home
from ..states import TaskState
from ..store.base import RunRecord, Store
from .options import RunOptions
from .restart import checkpoint_history


def check_inputs(home: Home, store: Store, run: RunRecord, loaded: LoadedFlow, *,
                 on_input_change: str | None = None, skip: str | None = None) -> None:
    """UsageError naming the change and the ``--on-input-change`` that would go on.

    ``on_input_change``: the policy this resume sets (None: the stored one);
    ``skip``: a step this resume starts over (``--restart-step``), which pins anew.
    """
    policy = RunOptions.from_json(run.options).with_changes(on_input_change=on_input_change).on_input_change
    for task in store.get_tasks(run.run_id):
        spec = loaded.flow.steps.get(task.step)
        decl = getattr(getattr(spec, "fn", None), "segue_map", None)
        if decl is None or task.state == TaskState.SUCCEEDED or task.step == skip:
            continue
        state = _committed_state(home, store, run, task.step, bool(getattr(spec, "allow_pickle", False)))
        if not isinstance(state, dict) or not isinstance(state.get("pin"), dict):
            continue  # no checkpoint yet: the first start pins the input as it is then
        _reconcile(decl, run, task.step, state["pin"], policy)


def _reconcile(decl: Any, run: RunRecord, step: str, pin: dict[str, Any], policy: str) -> None:
    from ..data.errors import InputChangedError
    from ..data.preflight import declared_source

    source = declared_source(decl, run.run_id, step, run.params)
    if source is None:
        return
    try:
        now = source.snapshot()
    except Exception:  # noqa: BLE001 - an unreadable input: the step's start says why
        return
    try:
        source.pinned(pin, now, policy, step)
    except InputChangedError as exc:
        raise UsageError(f"resume of run {run.run_id!r} refused: {exc}") from None


def _committed_state(home: Home, store: Store, run: RunRecord, step: str, allow_pickle: bool) -> Any:
    """The state of the newest committed checkpoint that loads, as the step would restore it.

    Read only: a checkpoint that fails verification is skipped here and
    quarantined by the step's own restore.
    """
    from ..checkpoint import load

    storage = home.run_storage(run)
    for rec in checkpoint_history(store, run.run_id, step):  # newest first
        if rec.status != "committed":
            continue
        try:
            payload = load(storage, rec.path, allow_pickle=allow_pickle).state
        except (CheckpointError, OSError):
            continue
        return payload.get("state") if isinstance(payload, dict) else None
    return None
