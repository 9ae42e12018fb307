"""Run lifecycle operations: the library API under the CLI.

Each function validates its input completely before it writes anything, so a
bad call costs nothing and leaves the store as it was.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._procs import pid_alive, wait_dead
from ..errors import (
    CodeChangedError,
    ControllerConflictError,
    IllegalTransitionError,
    RunStateError,
    UsageError,
)
from ..executor import executor_for
from ..flow import LoadedFlow, changed_steps, load_flow, resolve
from ..flow.model import StepSpec
from ..home import Home, check_run_id
from ..hostname import this_host
from ..scheduler.admission import check_satisfiable
from ..states import Actor, RunState, TaskState, check_run
from ..store.base import NewRun, RunRecord, Store, TaskRecord
from ..store.pools import open_pool
from . import restart
from .controller import Controller, Interrupts
from .options import RunOptions
from .spawn import spawn_detached as spawn_detached


@dataclass(frozen=True)
class Prepared:
    loaded: LoadedFlow
    run_id: str
    params: dict[str, Any]
    options: RunOptions


def prepare_run(
    flow_path: str | Path,
    params: Mapping[str, Any] | None = None,
    *,
    run_id: str | None = None,
    options: RunOptions | None = None,
    pool: Callable[[], Any] | None = None,
) -> Prepared:
    """Load and validate everything; writes nothing. ``pool`` opens the host pool
    (default: the one ``$SEGUE_POOL`` names), asked only when a step needs GPUs."""
    loaded = load_flow(flow_path)
    values = resolve(loaded.flow.params, dict(params or {}))
    if run_id is None:
        run_id = f"{loaded.flow.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    check_run_id(run_id)
    opts = options or RunOptions()
    if loaded.flow.pause_on_failure and not opts.pause_on_failure:
        opts = RunOptions.from_json({**opts.to_json(), "pause_on_failure": True})
    if opts.executor == "ray":  # Ray places the attempts: its cluster must be able to
        check_ray(loaded.flow.steps, opts.ray_address)
    else:  # a run that can never be placed on this host is refused now, not left waiting
        check_satisfiable(loaded.flow.steps, loaded.order, gpus=opts.gpus, gpu_memory=opts.gpu_memory,
                          pool=pool or open_pool)
    # A declared sink whose output belongs to another run is refused now (exit 2).
    from ..data.preflight import check_sinks  # data steps only; keeps `segue --help` light

    check_sinks(loaded.flow.steps, run_id, values, sources=opts.executor == "local")  # Ray: other disks
    if opts.checkpoints:
        from .storage_check import check_checkpoints

        opts = opts.with_changes(checkpoints=check_checkpoints(opts.checkpoints))
    return Prepared(loaded, run_id, values, opts)


def check_ray(steps: Mapping[str, StepSpec], address: str) -> None:
    """Refuse now what the Ray executor cannot run (one line each)."""
    from ..executor.ray import check_fits, connect, import_ray

    import_ray()
    if address:  # a cluster to ask; without one, the controller starts a local Ray
        check_fits(connect(address), {s.name: (s.resources, s.world_size) for s in steps.values()})


def create_run(store: Store, p: Prepared, *, actor: str = Actor.CLI) -> RunRecord:
    return store.create_run(
        NewRun(
            run_id=p.run_id,
            flow_name=p.loaded.flow.name,
            flow_path=str(p.loaded.path),
            params=p.params,
            fingerprint=p.loaded.fingerprint,
            options=p.options.to_json(),
        ),
        p.loaded.order,
        actor=actor,
    )


def check_code(run: RunRecord, loaded: LoadedFlow, allow_code_change: bool) -> None:
    if allow_code_change or run.fingerprint == loaded.fingerprint:
        return
    steps = changed_steps(run.fingerprint, loaded.fingerprint)
    what = f"steps {', '.join(repr(s) for s in steps)} changed" if steps else "module-level code changed"
    raise CodeChangedError(
        f"the code of run {run.run_id!r} changed since it began ({what}); "
        f"restore the original file or pass --allow-code-change"
    )


def make_controller(
    home: Home, store: Store, run: RunRecord, loaded: LoadedFlow, *, actor: str,
    on_tick: Callable[[RunRecord, list[TaskRecord]], None] | None = None,
    interrupts: Interrupts | None = None, pool: str | os.PathLike[str] | None = None,
    claim: tuple[int, str | None] | None = None,
) -> Controller:
    opts = RunOptions.from_json(run.options)
    return Controller(
        # A copy: the controller adds the tasks a fan-out or a loop creates (run/paths.py).
        home=home, store=store, run_id=run.run_id, steps=dict(loaded.flow.steps), order=loaded.order,
        executor=executor_for(opts.executor, opts.ray_address),
        actor=actor, on_tick=on_tick, interrupts=interrupts or Interrupts(),
        pool_path=None if pool is None else str(pool), claim=claim,
    )


def drive(controller: Controller, *, reason: str) -> RunState:
    """Acquire the run, make it runnable and drive it to a resting state."""
    controller.acquire()
    try:
        controller.prepare(reason)
    except BaseException:
        controller.release()
        raise
    return controller.drive()


def refuse_unless_allowed(run: RunRecord, to_state: RunState) -> None:
    """Check the user's command against the transition table before writing.

    A refusal here is the user's (RunStateError, exit 2, nothing written). The
    store checks again inside its transaction: a run that moved after this
    check makes it raise IllegalTransitionError, a race (exit 4).
    """
    try:
        check_run(run.state, to_state)
    except IllegalTransitionError as exc:
        raise RunStateError.refusing(exc) from None


def check_resumable(store: Store, run_id: str) -> RunRecord:
    run = store.get_run(run_id)
    if run.state in (RunState.SUCCEEDED, RunState.CANCELLED):
        refuse_unless_allowed(run, RunState.RUNNING)
    return run


def apply_resume_choices(
    store: Store, run: RunRecord, *, restart_step: str | None = None,
    on_input_change: str | None = None, actor: str = Actor.CLI, on_env_change: str | None = None,
    flow: Mapping[str, StepSpec] | None = None,
) -> RunRecord:
    """The operator's changes at resume: validated first, then stored, before any controller starts.

    A plain resume is refused (exit 2) when a step could only start from
    scratch; ``restart_step`` is the explicit way (segue.run.restart).
    ``on_input_change`` replaces the stored option every later worker reads.
    ``flow``: the run's steps; with them, ``restart_step`` may name a step that
    succeeded, whose path then starts over (:func:`segue.run.restart.restart_path`).
    """
    opts = RunOptions.from_json(run.options).with_changes(on_input_change=on_input_change,
                                                          on_env_change=on_env_change)
    path = False
    if restart_step is not None:
        restart.check_step(store, run.run_id, restart_step, flow)
        path = flow is not None and restart.starts_path(store, run.run_id, restart_step, flow)
    restart.check_resumable_steps(
        store, run.run_id, skip=restart_step,
        also=restart.downstream(flow, restart_step) if path and flow and restart_step else ())
    if opts.to_json() != RunOptions.from_json(run.options).to_json():
        run = store.set_run_options(run.run_id, opts.to_json(), actor=actor,
                                    reason="options changed at resume: " + ", ".join(
                                        f"{k}={v}" for k, v in (("on_input_change", on_input_change),
                                                                ("on_env_change", on_env_change))
                                        if v is not None))
    if restart_step is not None and path and flow is not None:
        restart.restart_path(store, run.run_id, restart_step, flow, actor=actor)
    elif restart_step is not None:
        restart.restart_step(store, run.run_id, restart_step, actor=actor)
    return run


def check_no_live_controller(run: RunRecord, at: float, grace_s: float = 2.0) -> None:
    """Refuse a second controller while the first is alive at ``at`` (the store's
    clock; a dying one gets a grace period)."""
    if not run.controller_alive(at) or run.state not in (RunState.RUNNING, RunState.PAUSING):
        return
    if run.controller_host == this_host() and wait_dead(run.controller_pid, grace_s):
        return
    raise ControllerConflictError(
        f"run {run.run_id!r} is already driven by a live controller (pid {run.controller_pid} "
        f"on {run.controller_host}); pause it first, or wait for it to finish"
    )


def request_pause(store: Store, run_id: str, *, actor: str = Actor.CLI) -> RunRecord:
    """Ask the run to pause. Returns the record after the request.

    A run paused by preemption would resume by itself; an operator's pause
    cancels that, so it stays paused until `segue resume`.
    """
    run = store.get_run(run_id)
    if run.state == RunState.PAUSED and clear_preemption(store, run_id):
        store.append_event(run_id, "scheduler", actor=actor,
                           reason="paused by the operator; it will not resume by itself")
    if run.state in (RunState.PAUSING, RunState.PAUSED):
        return run
    if run.state != RunState.PENDING:
        refuse_unless_allowed(run, RunState.PAUSING)
    if run.state == RunState.PENDING:
        return store.transition_run(run_id, RunState.PAUSED, actor=actor, reason="paused before it started")
    run = store.transition_run(run_id, RunState.PAUSING, actor=actor, reason="pause requested",
                               only_from=(RunState.RUNNING,))
    return run


def clear_preemption(store: Store, run_id: str) -> bool:
    """Forget that a run waits to resume after preemption; True if it did."""
    stats = store.get_stats(run_id)  # type: ignore[attr-defined]
    if stats.get("preempted_at", 0.0) <= 0:
        return False
    store.set_stats(run_id, {"preempted_at": 0.0})  # type: ignore[attr-defined]
    return True


def settle_orphaned_pause(store: Store, run_id: str, *, actor: str = Actor.CLI) -> RunRecord:
    """Finish a pause whose controller is gone: park tasks whose leases have expired.

    With no controller, nobody would ever move PAUSING to PAUSED. Workers die
    with their controller, so once every RUNNING task's lease has expired the
    run is safely at rest.
    """
    run = store.get_run(run_id)
    now = store.now()
    if run.state != RunState.PAUSING or run.controller_alive(now) and (
        run.controller_host != this_host() or pid_alive(run.controller_pid)
    ):
        return run
    tasks = store.get_tasks(run_id)
    here = this_host()
    if any(t.state == TaskState.RUNNING and (t.lease_until or 0) > now
           and ((t.host or run.controller_host) != here or pid_alive(t.pid)) for t in tasks):
        return run
    for t in tasks:
        if t.state in (TaskState.RUNNING, TaskState.RETRYING):
            store.transition_task(run_id, t.step, TaskState.PARKED, actor=actor, epoch=t.epoch,
                                  reason="parked after its controller was lost")
    return store.transition_run(run_id, RunState.PAUSED, actor=actor,
                                reason="every task parked (controller was gone)")


def wait_for_state(
    store: Store, run_id: str, states: set[RunState], timeout: float | None,
    poll_s: float = 0.05, *, actor: str = Actor.CLI,
) -> RunRecord:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        run = settle_orphaned_pause(store, run_id, actor=actor)
        if run.state in states:
            return run
        if deadline is not None and time.monotonic() > deadline:
            return run
        time.sleep(poll_s)


def cancel(store: Store, run_id: str, *, actor: str = Actor.CLI,
           reason: str = "cancelled by the operator") -> RunRecord:
    run = store.get_run(run_id)
    if run.state in (RunState.SUCCEEDED, RunState.CANCELLED):
        refuse_unless_allowed(run, RunState.CANCELLED)
    run = store.transition_run(run_id, RunState.CANCELLED, actor=actor, reason=reason)
    if not run.controller_alive(store.now()) or (run.controller_host == this_host()
                                      and not pid_alive(run.controller_pid)):
        for t in store.get_tasks(run_id):
            if not t.state.done and t.state != TaskState.RUNNING:
                store.transition_task(run_id, t.step, TaskState.CANCELLED, actor=actor,
                                      reason="run cancelled")
    return run


def require_home(home: Home) -> None:
    if not home.exists():
        raise UsageError(f"no segue home at {home.root}; start a run first or pass --home / SEGUE_HOME")


def checkpoint_now(home: Home, store: Store, run_id: str, *, actor: str = Actor.CLI) -> list[str]:
    """Ask every running task of the run to checkpoint at its next pause point (SIGUSR2 to a
    local worker, through its actor on Ray); the steps asked. UsageError if none runs."""
    import signal

    run = store.get_run(run_id)
    running = [t for t in store.get_tasks(run_id) if t.state == TaskState.RUNNING]
    if run.options.get("executor") == "ray":  # the workers are on Ray nodes: ask their actors
        from ..executor.ray import signal_attempt

        address, where = str(run.options.get("ray_address") or ""), "on its Ray cluster"
        asked = [t.step for t in running
                 if signal_attempt(address, home.root, run_id, t.step, t.epoch, signal.SIGUSR2)]
    else:
        here, where = this_host(), "on this host"
        asked = [t.step for t in running if t.pid and (t.host or here) == here and _signal(t.pid, signal.SIGUSR2)]
    if not asked:
        raise UsageError(f"run {run_id!r} has no running task {where} to checkpoint")
    store.append_event(run_id, "command", actor=actor, reason=f"checkpoint now: asked {', '.join(asked)}",
                       data={"command": "checkpoint_now", "steps": asked})
    return asked


def _signal(pid: int, sig: int) -> bool:
    """``sig`` to a local worker; False if it is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True
