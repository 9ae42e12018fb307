"""The status document of a run: what `segue status --json` prints."""

from __future__ import annotations

import time
from typing import Any

from ..scheduler.pricing import Prices
from ..states import TaskState
from ..store.base import CheckpointRecord, Store
from . import costs
from .logs import last_failures
from .procs import controller_alive
from .recovery import lost_controller


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
    failures = last_failures(store.list_events(run_id, kinds=("failure",)))  # kept by the controller
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
            "error": t.error,
            "waiting_for": waiting[t.step].reason if t.step in waiting else None,
            "last_failure": failures.get(t.step),
        })
    at = store.now()  # leases are judged on the store's clock, not this host's
    return {
        "run_id": run.run_id,
        "priority": run.options.get("priority", 100),
        "state": run.state.value,
        "flow": run.flow_name,
        "flow_path": run.flow_path,
        "params": run.params,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "controller": {
            "pid": run.controller_pid,
            "host": run.controller_host,
            "alive": controller_alive(run, at),  # a dead local pid is dead now
            "lease_until": run.controller_lease_until,
        },
        # Set when the run looks alive but nothing drives it (see lost_controller).
        "problem": lost_controller(run, at),
        "steps": steps,
        "accounting": accounting(store, run_id, prices, pool=pool, home_key=home_key),
    }


def _unit(ck: CheckpointRecord | None) -> str | None:
    unit = ck.position.get("unit") if ck is not None and isinstance(ck.position, dict) else None
    return unit if isinstance(unit, str) else None


def paused_seconds(store: Store, run_id: str, until: float | None = None) -> float:
    """Time the run spent PAUSED (or PAUSING), from its event log."""
    total, since = 0.0, None
    for e in store.list_events(run_id, kinds=("run",)):
        if e.to_state is None:
            continue
        if e.to_state in ("PAUSING", "PAUSED") and since is None:
            since = e.time
        elif e.to_state not in ("PAUSING", "PAUSED") and since is not None:
            total += e.time - since
            since = None
    if since is not None:
        total += (until or time.time()) - since
    return total


def accounting(store: Store, run_id: str, prices: Prices | None = None, *, pool: Any = None,
               home_key: str | None = None) -> dict[str, Any]:
    """Time, devices, storage and money; every figure is defined in docs/accounting.md."""
    return costs.accounting(store, run_id, prices, pool=pool, home_key=home_key)
