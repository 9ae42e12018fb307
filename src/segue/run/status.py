"""The status document of a run: what `segue status --json` prints."""

from __future__ import annotations

import os
import time
from typing import Any

from .._procs import controller_alive
from ..flow.model import task_step
from ..placement.pricing import Prices
from ..scheduler.views import display_states
from ..states import TaskState
from ..store.base import CheckpointRecord, Event, Store, TaskRecord
from . import costs
from .logs import last_failures
from .recovery import controller_waiting, lost_controller


def run_status(store: Store, run_id: str, prices: Prices | None = None, *, pool: Any = None,
               home_key: str | None = None, items: bool = False) -> dict[str, Any]:
    """``pool``/``home_key``: the host pool and this home's name in it, to count the
    attempts running now in the accounting (without them, only finished attempts).

    The tasks of a fan-out or a loop (``NAME.K``) are folded into their step's entry
    (``items``: counts by state, and the tasks that are not settled nor waiting);
    ``items=True`` lists every one of them there."""
    run = store.get_run(run_id)
    tasks = store.get_tasks(run_id)
    latest: dict[str, CheckpointRecord] = {}
    for c in store.list_checkpoints(run_id):
        if c.step not in latest or c.seq > latest[c.step].seq:
            latest[c.step] = c
    waiting = {r.step: r for r in getattr(store, "list_requests", lambda: [])() if r.run_id == run_id}
    # Errors and failures are history only a task that failed or ran again has: a run
    # whose thousands of tasks each ran once needs none of their events.
    again = any(t.attempts > 1 or t.failures or t.error for t in tasks)
    history = store.list_events(run_id, kinds=("task", "failure")) if again else []
    failures = last_failures([e for e in history if e.kind == "failure"])  # kept by the controller
    errors = step_errors(history)
    steps = []
    recent = RecentQueueMetrics(store, run_id)
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
            "queue": queue_lag(store, run_id, t.step, t.state, ck, recent),
        })
    steps = fold_items(steps, every=items)
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
        "accounting": accounting(store, run_id, prices, pool=pool, home_key=home_key, tasks=tasks),
    }


EARLIER_ERRORS = 5  # the newest ones; `segue events RUN` has all
ACTIVE_ITEMS = 20  # a folded step lists at most this many of its running or failing tasks


def fold_items(steps: list[dict[str, Any]], *, every: bool = False) -> list[dict[str, Any]]:
    """Each step's entry, with the tasks of a fan-out or a loop folded into it (``items``)."""
    kids: dict[str, list[dict[str, Any]]] = {}
    shown: list[dict[str, Any]] = []
    for doc in steps:
        step, k = task_step(doc["name"])
        (shown if k is None else kids.setdefault(step, [])).append(doc)
    for doc in shown:
        mine = kids.get(doc["name"])
        if mine is None:
            continue
        states: dict[str, int] = {}
        for d in mine:
            states[d["state"]] = states.get(d["state"], 0) + 1
        active = [d for d in mine if d["state"] not in ("SUCCEEDED", "PENDING", "SKIPPED")]
        doc["items"] = {"total": len(mine), "states": states,
                        "tasks": mine if every else active[:ACTIVE_ITEMS],
                        "more": 0 if every else max(0, len(active) - ACTIVE_ITEMS)}
        doc["progress"] = {"done": states.get("SUCCEEDED", 0), "total": len(mine), "unit": "tasks"}
        doc["attempts"] = sum(d["attempts"] for d in mine)
    return shown


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


QUEUE_RECENT_S = 60.0  # a running step without a queue checkpoint yet: its recent metrics only


class RecentQueueMetrics:
    """The ``queue_*`` points every step of a run wrote in the last minute, read once
    (one query for all the run's running steps, not one each)."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self._by_step: dict[str, dict[str, float | None]] | None = None

    def of(self, step: str) -> dict[str, float | None]:
        if self._by_step is None:
            self._by_step = {}
            try:
                points = self.store.get_metrics(self.run_id, since=self.store.now() - QUEUE_RECENT_S)
            except Exception:  # noqa: BLE001 - a status shows what it can
                points = []
            for p in points:
                if p.name.startswith("queue_") and p.index == 0:
                    self._by_step.setdefault(p.step, {})[p.name[len("queue_"):]] = p.value
        return self._by_step.get(step, {})


def queue_lag(store: Store, run_id: str, step: str, state: TaskState,
              ck: CheckpointRecord | None,
              recent: RecentQueueMetrics | None = None) -> dict[str, Any] | None:
    """The lag of a step reading a message queue, as the step last reported it (the
    broker is never asked here): the newer of its ``queue_*`` step metrics (written by its
    heartbeat, every few seconds while it reads) and the figure in its last checkpoint's
    position. Keys: pending, undelivered, oldest_age_s (None where the broker does not
    say), keeps_s and keeps (how long the broker keeps unacknowledged messages), at (when
    measured), note, and, for a step not running, stopped_s with a warning once the stop
    is longer than what the broker keeps. None for a step that reads no queue."""
    pos = ck.position if ck is not None and isinstance(ck.position, dict) else {}
    marked = isinstance(pos.get("queue"), dict)
    if not marked and state != TaskState.RUNNING:
        return None
    # A step that reads no queue may log many points: read them all only for a marked step,
    # else the run's last minute (the first report comes before any checkpoint).
    reported: dict[str, Any] = {}
    if marked:
        try:
            points = store.get_metrics(run_id, step)
        except Exception:  # noqa: BLE001 - a status shows what it can
            points = []
        reported = {p.name[len("queue_"):]: p.value for p in points
                    if p.name.startswith("queue_") and p.index == 0}
    else:
        reported = dict((recent or RecentQueueMetrics(store, run_id)).of(step))
    fig: dict[str, Any] = dict(pos.get("queue") or {}) if marked else {}
    if reported.get("at") is not None and float(reported["at"]) >= float(fig.get("at") or 0):
        fig.update({k: (int(v) if k in ("pending", "undelivered") and v is not None else v)
                    for k, v in reported.items()})
    if not fig:
        return None
    for key in ("pending", "undelivered", "oldest_age_s", "keeps_s", "keeps", "at", "note"):
        fig.setdefault(key, None)
    if fig["keeps"] is None and fig["keeps_s"] is not None:  # words come with checkpoints only
        fig["keeps"] = f"unacknowledged messages for about {_span(float(fig['keeps_s']))}"
    if state != TaskState.RUNNING and fig["at"] is not None and state.value != "SUCCEEDED":
        stopped = max(0.0, time.time() - float(fig["at"]))
        fig["stopped_s"] = round(stopped, 1)
        if fig["keeps_s"] is not None and stopped > float(fig["keeps_s"]):
            fig["warning"] = (f"stopped for {_span(stopped)}, longer than the broker keeps "
                              f"unacknowledged messages ({fig['keeps']}): messages it has not "
                              f"read may be lost; resume it")
    return fig


def queue_text(q: dict[str, Any]) -> str:
    """One line for `segue status`: ``queue: 12 pending, 3400 undelivered, oldest 4.2 s``."""
    def n(v: Any) -> str:
        return "?" if v is None else f"{int(v)}"
    parts = [f"{n(q.get('pending'))} pending", f"{n(q.get('undelivered'))} undelivered"]
    if q.get("oldest_age_s") is not None:
        parts.append(f"oldest {_span(float(q['oldest_age_s']))}")
    if q.get("at") is not None:
        parts.append(f"{_span(max(0.0, time.time() - float(q['at'])))} ago")
    line = "queue: " + ", ".join(parts)
    if q.get("keeps"):
        line += f"; the broker keeps {q['keeps']}"
    if q.get("warning"):
        line += f"; WARNING: {q['warning']}"
    return line


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _unit(ck: CheckpointRecord | None) -> str | None:
    unit = ck.position.get("unit") if ck is not None and isinstance(ck.position, dict) else None
    return unit if isinstance(unit, str) else None


def accounting(store: Store, run_id: str, prices: Prices | None = None, *, pool: Any = None,
               home_key: str | None = None, tasks: list[TaskRecord] | None = None) -> dict[str, Any]:
    """Time, devices, storage and money; every figure is defined in docs/accounting.md."""
    return costs.accounting(store, run_id, prices, pool=pool, home_key=home_key, tasks=tasks)
