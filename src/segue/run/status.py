"""The status document of a run: what `segue status --json` prints."""

from __future__ import annotations

import os
from typing import Any

from .._procs import controller_alive
from ..placement.pricing import Prices
from ..scheduler.views import display_states
from ..states import TaskState
from ..store.base import CheckpointRecord, Event, Store
from . import costs
from .logs import last_failures
from .recovery import controller_waiting, lost_controller


def run_status(store: Store, run_id: str, prices: Prices | None = None, *, pool: Any = None,
               home_key: str | None = None) -> dict[str, Any]:
    """``pool``/``home_key``: the host pool and this home's name in it, to count the
    attempts running now in the accounting (without them, only finished attempts)."""
    run = store.get_run(run_id)
    tasks = store.get_tasks(run_id)
    latest: dict[str, CheckpointRecord] = {}
    for c in store.list_checkpoints(run_id):
        if c.step not in latest or c.seq > latest[c.step].seq:
            latest[c.step] = c
    waiting = {r.step: r for r in getattr(store, "list_requests", lambda: [])() if r.run_id == run_id}
    history = store.list_events(run_id, kinds=("task", "failure"))
    failures = last_failures([e for e in history if e.kind == "failure"])  # kept by the controller
    errors = step_errors(history)
    steps = []
    for t in tasks:
        ck = latest.get(t.step)
        steps.append({
            "name": t.step,
            "state": t.state.value,
            # unit: "bytes" or "records" for a data step (from its checkpoint), else None.
            "progress": {"done": t.progress_done, "total": t.progress_total, "unit": _unit(ck)},
            "attempts": t.attempts,
            "failures": t.failures,
            "epoch": t.epoch,
            "last_checkpoint": None if ck is None else {
                "time": ck.created_at, "seq": ck.seq, "position": ck.position, "bytes": ck.nbytes,
            },
            "pid": t.pid if t.state == TaskState.RUNNING else None,
            # The attempt's last heartbeat (the task row's last write while RUNNING).
            "last_heartbeat": t.updated_at if t.state == TaskState.RUNNING else None,
            # Only the error that put the step in its state; older ones are history.
            "error": t.error if errors.get(t.step, (False, []))[0] else None,
            "earlier_errors": errors.get(t.step, (False, []))[1],
            "waiting_for": waiting[t.step].reason if t.step in waiting else None,
            "last_failure": failures.get(t.step),
        })
    at = store.now()  # leases are judged on the store's clock, not this host's
    return {
        "run_id": run.run_id,
        "priority": run.options.get("priority", 100),
        "state": run.state.value,
        # What `segue ls` shows for it ("WAITING (batch)" for a run without a device): one rule.
        "shown": display_states(store, [run])[run.run_id],
        "flow": run.flow_name,
        "flow_path": run.flow_path,
        "params": run.params,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "controller": {
            "pid": run.controller_pid,
            "host": run.controller_host,
            "alive": controller_alive(run, at),  # a dead local pid is dead now
            # Its lease lapsed but its process lives here: it waits for the store.
            "waiting": not controller_alive(run, at) and controller_waiting(run),
            "lease_until": run.controller_lease_until,
        },
        # Set when the run looks alive but nothing drives it (see lost_controller).
        "problem": lost_controller(run, at, store_dir=_store_dir(store)),
        "steps": steps,
        "accounting": accounting(store, run_id, prices, pool=pool, home_key=home_key),
    }


EARLIER_ERRORS = 5  # the newest ones; `segue events RUN` has all


def step_errors(events: list[Event]) -> dict[str, tuple[bool, list[dict[str, Any]]]]:
    """Per step: whether its stored error is current (the transition into its state
    recorded it), and the errors of its earlier attempts, oldest first."""
    attempt_of: dict[tuple[str, Any], Any] = {}
    out: dict[str, tuple[bool, list[dict[str, Any]]]] = {}
    for e in events:
        if e.kind != "task" or not e.step:
            continue
        d = e.data or {}
        if e.to_state == TaskState.RUNNING.value and "epoch" in d:
            attempt_of[(e.step, d["epoch"])] = d.get("attempt")
        past = out.get(e.step, (False, []))[1]
        if "error" in d:
            past = [*past, {"time": e.time, "epoch": d.get("epoch"),
                            "attempt": attempt_of.get((e.step, d.get("epoch"))), "error": d["error"]}]
        out[e.step] = ("error" in d, past)
    # A current error is the step's own, not history.
    return {k: (cur, (past[:-1] if cur else past)[-EARLIER_ERRORS:]) for k, (cur, past) in out.items()}


def _store_dir(store: Store) -> str | None:
    path = getattr(store, "path", None)  # a SQLite file; PostgreSQL has none here
    return os.path.dirname(os.path.abspath(path)) if isinstance(path, str | os.PathLike) else None


def _unit(ck: CheckpointRecord | None) -> str | None:
    unit = ck.position.get("unit") if ck is not None and isinstance(ck.position, dict) else None
    return unit if isinstance(unit, str) else None


def accounting(store: Store, run_id: str, prices: Prices | None = None, *, pool: Any = None,
               home_key: str | None = None) -> dict[str, Any]:
    """Time, devices, storage and money; every figure is defined in docs/accounting.md."""
    return costs.accounting(store, run_id, prices, pool=pool, home_key=home_key)
