"""The status document of a run: what `segue status --json` prints."""

from __future__ import annotations

import time
from typing import Any

from ..states import TaskState
from ..store.base import CheckpointRecord, Store


def run_status(store: Store, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    tasks = store.get_tasks(run_id)
    latest: dict[str, CheckpointRecord] = {}
    for c in store.list_checkpoints(run_id):
        if c.step not in latest or c.seq > latest[c.step].seq:
            latest[c.step] = c
    waiting = {r.step: r for r in getattr(store, "list_requests", lambda: [])() if r.run_id == run_id}
    steps = []
    for t in tasks:
        ck = latest.get(t.step)
        steps.append({
            "name": t.step,
            "state": t.state.value,
            "progress": {"done": t.progress_done, "total": t.progress_total},
            "attempts": t.attempts,
            "failures": t.failures,
            "epoch": t.epoch,
            "last_checkpoint": None if ck is None else {
                "time": ck.created_at, "seq": ck.seq, "position": ck.position, "bytes": ck.nbytes,
            },
            "pid": t.pid if t.state == TaskState.RUNNING else None,
            "error": t.error,
            "waiting_for": waiting[t.step].reason if t.step in waiting else None,
        })
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
            "alive": run.controller_alive(time.time()),
        },
        "steps": steps,
        "accounting": accounting(store, run_id),
    }


def paused_seconds(store: Store, run_id: str, until: float | None = None) -> float:
    """Time the run spent PAUSED (or PAUSING), from its event log."""
    total, since = 0.0, None
    for e in store.list_events(run_id):
        if e.kind != "run" or e.to_state is None:
            continue
        if e.to_state in ("PAUSING", "PAUSED") and since is None:
            since = e.time
        elif e.to_state not in ("PAUSING", "PAUSED") and since is not None:
            total += e.time - since
            since = None
    if since is not None:
        total += (until or time.time()) - since
    return total


def accounting(store: Store, run_id: str) -> dict[str, Any]:
    stats: dict[str, float] = getattr(store, "get_stats", lambda r: {})(run_id)
    ckpt_bytes = sum(c.nbytes for c in store.list_checkpoints(
        run_id, statuses=("committed", "quarantined", "pruned")))
    return {
        "device_seconds": round(stats.get("device_s", 0.0), 3),
        "attempt_seconds": round(stats.get("attempt_s", 0.0), 3),
        "paused_seconds": round(paused_seconds(store, run_id), 3),
        "checkpoint_bytes": ckpt_bytes,
        "work_redone_seconds": round(stats.get("work_redone_s", 0.0), 3),
        "device_seconds_redone": round(stats.get("device_s_redone", 0.0), 3),
        "seconds_saved_by_resume": round(stats.get("saved_s", 0.0), 3),
        "device_seconds_saved_by_resume": round(stats.get("device_s_saved", 0.0), 3),
        "preemptions": int(stats.get("preemptions", 0)),
        "waiting_for_resources": stats.get("preempted_at", 0.0) > 0,
    }
