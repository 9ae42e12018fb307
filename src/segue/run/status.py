"""The status document of a run: what `segue status --json` prints."""

from __future__ import annotations

import time
from typing import Any

from ..states import TaskState
from ..store.base import Store


def run_status(store: Store, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    tasks = store.get_tasks(run_id)
    latest: dict[str, Any] = {}
    for c in store.list_checkpoints(run_id):
        if c.step not in latest or c.seq > latest[c.step].seq:
            latest[c.step] = c
    steps = []
    for t in tasks:
        c = latest.get(t.step)
        steps.append({
            "name": t.step,
            "state": t.state.value,
            "progress": {"done": t.progress_done, "total": t.progress_total},
            "attempts": t.attempts,
            "failures": t.failures,
            "epoch": t.epoch,
            "last_checkpoint": None if c is None else {
                "time": c.created_at, "seq": c.seq, "position": c.position, "bytes": c.nbytes,
            },
            "pid": t.pid if t.state == TaskState.RUNNING else None,
            "error": t.error,
        })
    return {
        "run_id": run.run_id,
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
    }
