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

from ..data.pinning import changes
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


def check_decisions(home: Home, store: Store, run: RunRecord, loaded: LoadedFlow, *,
                    on_input_change: str | None = None, restart: str | None = None) -> list[str]:
    """The run's recorded path against the files it was decided from (``inputs=``).

    A fan-out or a branch decided from files that changed since is refused with a
    line naming the decision and the change, unless the policy keeps the recorded
    path (``pin``; ``include-new`` too: what data steps read is theirs to judge);
    returns what was kept despite a change, for the run's events. Nothing is checked
    once every task is settled, and nothing is ever decided again here: ``restart``
    (``--restart-step``) starts a step and those after it over, and they decide anew.
    """
    from .paths import snapshot_inputs
    from .restart import downstream

    again = set(downstream(loaded.flow.steps, restart)) if restart in loaded.flow.steps else set()

    policy = RunOptions.from_json(run.options).with_changes(on_input_change=on_input_change).on_input_change
    if all(t.state.settled for t in store.get_tasks(run.run_id)):
        return []
    kept: list[str] = []
    for e in store.list_events(run.run_id, kinds=("decision",)):
        kind = e.data.get("kind")
        decider = e.step if kind == "branch" else e.data.get("over") if kind == "foreach" else None
        spec = loaded.flow.steps.get(decider or "")
        ref = e.data.get("output_ref")
        if spec is None or spec.name in again or not spec.inputs or "inputs_digest" not in e.data \
                or not isinstance(ref, str):
            continue
        old = _saved_inputs(home, run, ref, spec.allow_pickle)
        if old is None:
            continue
        added, removed, modified = changes(old, snapshot_inputs(spec, run.params))
        diff = added + removed + modified
        if not diff:
            continue
        shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
        what = (f"the choice of {', '.join(e.data.get('chose', []))} by {decider}" if kind == "branch"
                else f"the fan-out of {e.step} over {e.data.get('items')} item(s) of {decider}")
        if policy == "fail":
            raise UsageError(f"resume of run {run.run_id!r} refused: {what} was made from inputs that changed "
                             f"since ({shown}); pass --on-input-change pin to keep the path taken, or "
                             f"--restart-step {decider} to decide again")
        kept.append(f"{what} is kept (--on-input-change {policy}) although its inputs changed: {shown}")
    return kept


def _saved_inputs(home: Home, run: RunRecord, ref: str, allow_pickle: bool) -> dict[str, Any] | None:
    from ..checkpoint import load

    try:
        state = load(home.run_storage(run), ref, allow_pickle=allow_pickle).state
    except (CheckpointError, OSError):
        return None  # an output that does not load: the step that reads it says so
    return state.get("inputs") if isinstance(state, dict) else None


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
