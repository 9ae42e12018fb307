"""Starting one step over on purpose: ``segue resume RUN --restart-step STEP``.

A step whose committed checkpoints all failed verification must never start
from scratch by itself: its sinks already published what those checkpoints
covered, and a fresh start would publish it again beside the old parts. The
store remembers every checkpoint a step ever committed (quarantined and
pruned ones keep their rows), so "had committed checkpoints, none usable" is
a fact a restore can read. Only the operator's ``--restart-step`` clears it:
it records a ``restart-step`` event holding the highest seq it discards, marks
the step's committed checkpoints pruned, and from then on restores ignore
every checkpoint at or below that seq. The step then starts without state,
and a data step's sinks, opened without state, discard every part this run's
step published before (segue.data.sinks).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ..errors import NotFoundError, NoValidCheckpointError, UsageError
from ..flow.model import StepSpec, task_step
from ..states import Actor, TaskState
from ..store.base import CheckpointRecord, Store

EVENT = "restart-step"
ALL_STATUSES = ("committed", "quarantined", "pruned")


def restart_floor(store: Store, run_id: str, step: str) -> int:
    """The highest checkpoint seq of ``step`` discarded by a restart (0: never restarted)."""
    floor = 0
    for e in store.list_events(run_id, kinds=(EVENT,)):
        if e.step == step:
            floor = max(floor, int(e.data.get("discarded_through_seq", 0)))
    return floor


def checkpoint_history(store: Store, run_id: str, step: str) -> list[CheckpointRecord]:
    """Every checkpoint the step committed since its last restart (any status), newest first."""
    floor = restart_floor(store, run_id, step)
    return [c for c in store.list_checkpoints(run_id, step, statuses=ALL_STATUSES) if c.seq > floor]


def no_valid_checkpoint(run_id: str, step: str, total: int, details: str) -> NoValidCheckpointError:
    return NoValidCheckpointError(
        f"step {step!r} of run {run_id!r}: none of its {total} committed checkpoints verifies "
        f"({details}); they are in quarantine/ and the step will not start from scratch on its own; "
        f"start it over with `segue resume {run_id} --restart-step {step}` (this discards what "
        f"the step published)"
    )


def check_resumable_steps(store: Store, run_id: str, *, skip: str | None = None,
                          also: Collection[str] = ()) -> None:
    """Refuse a plain resume when a step could only start from scratch (exit 2, nothing written).
    ``skip`` (and the steps of ``also`` with their items): started over by this resume."""
    for t in store.get_tasks(run_id):
        if t.state == TaskState.SUCCEEDED or t.step == skip or task_step(t.step)[0] in also:
            continue
        history = checkpoint_history(store, run_id, t.step)
        if history and not any(c.status == "committed" for c in history):
            err = no_valid_checkpoint(run_id, t.step, len(history), "all were quarantined")
            raise UsageError(str(err))


def check_step(store: Store, run_id: str, step: str, flow: Mapping[str, StepSpec] | None = None) -> None:
    """``--restart-step STEP`` names a step of the run that has not succeeded, or (given the
    flow's steps) any step of it: one that succeeded starts its path over (else UsageError)."""
    steps = {t.step: t for t in store.get_tasks(run_id)}
    if step not in steps or (flow is not None and task_step(step)[1] is not None):
        known = ", ".join(n for n in steps if task_step(n)[1] is None)
        raise NotFoundError(f"run {run_id!r} has no step {step!r}; its steps are {known}")
    if steps[step].state == TaskState.SUCCEEDED and flow is None:
        raise UsageError(f"step {step!r} of run {run_id!r} already succeeded; --restart-step only "
                         f"starts over a step that has not finished; start a new run instead")


def restart_step(store: Store, run_id: str, step: str, *, actor: str = Actor.CLI) -> int:
    """Discard ``step``'s checkpoints so its next attempt starts fresh; returns the floor seq."""
    check_step(store, run_id, step)
    everything = store.list_checkpoints(run_id, step, statuses=ALL_STATUSES)
    floor = max((c.seq for c in everything), default=0)
    # The event is the commit point: once it exists no restore uses these checkpoints.
    store.append_event(run_id, EVENT, actor=actor, step=step,
                       reason=f"step {step!r} starts over: checkpoints through seq {floor} discarded "
                              f"and its earlier output is discarded at its next start",
                       data={"discarded_through_seq": floor})
    for c in everything:
        if c.status == "committed":
            store.set_checkpoint_status(run_id, step, c.seq, "pruned", actor=actor,
                                        reason=f"discarded by --restart-step {step}")
    return floor


def starts_path(store: Store, run_id: str, step: str, flow: Mapping[str, StepSpec]) -> bool:
    """Whether ``--restart-step STEP`` starts a path over: the step succeeded (what came after
    it may have been decided from its output), or it is a fan-out or a loop."""
    t = store.get_task(run_id, step)
    return t.state in (TaskState.SUCCEEDED, TaskState.SKIPPED) or flow[step].dynamic


def downstream(flow: Mapping[str, StepSpec], step: str) -> list[str]:
    """``step`` and every step that runs after it, directly or not, in declaration order."""
    out = {step}
    changed = True
    while changed:
        changed = False
        for spec in flow.values():
            if spec.name not in out and out.intersection(spec.after):
                out.add(spec.name)
                changed = True
    return [n for n in flow if n in out]


def restart_path(store: Store, run_id: str, step: str, flow: Mapping[str, StepSpec], *,
                 actor: str = Actor.CLI) -> list[str]:
    """Start ``step`` and everything after it over, in one store transaction: their tasks back
    to PENDING with their checkpoints discarded, the items and iterations of the fan-outs and
    loops among them dropped. Their next decisions are made anew from the outputs the steps
    commit then (the controller reads decisions recorded after the restart only). Returns the
    steps started over."""
    steps = downstream(flow, step)
    tasks = [t.step for t in store.get_tasks(run_id)]
    drop = [n for n in tasks if task_step(n)[1] is not None and task_step(n)[0] in steps]
    store.restart_path(run_id, step, reset=steps, drop=drop, actor=actor,
                       reason=f"--restart-step {step}: {step} and the {len(steps) - 1} step(s) after it "
                              f"start over; their path is decided again"
                              + (f" ({len(drop)} item(s) and iteration(s) dropped)" if drop else ""))
    return steps
