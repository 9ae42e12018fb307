"""What `segue pool` and `segue ls` show of the scheduler: documents built from the pool and store."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..states import RunState
from ..store.pool import AllocationRecord, HostPool
from .devices import GpuProcesses
from .policy import priority_name


def pool_doc(hp: HostPool, allocs: Iterable[AllocationRecord], procs: GpuProcesses,
             home: str | None = None) -> dict[str, Any]:
    """The pool as `segue pool --json` shows it.

    ``procs``: what the driver reports on each physical device; a device in
    use by processes while segue allocated it to nobody is marked ``busy``
    (something outside segue, or a segue run of another pool, uses it).
    """
    allocs = list(allocs)
    holder = {d: al for al in allocs for d in al.devices}
    devices = []
    for d in hp.devices:
        h = holder.get(d.index)
        others = [] if d.virtual else procs.get(d.index, [])
        devices.append({
            "index": d.index, "name": d.name, "memory": d.memory, "virtual": d.virtual,
            "holder": None if h is None else {
                "home": h.home, "run_id": h.run_id, "step": h.step, "priority": h.priority,
                "since": h.since,
            },
            "processes": [{"pid": pid, "memory": mem} for pid, mem in others],
            "busy_outside_pool": h is None and bool(others),
        })
    return {
        "host": hp.host, "source": hp.source, "cpus": hp.cpus, "memory": hp.memory,
        # cpus are budgeted per home (devices are the machine's): this home's share
        "cpus_allocated": sum(al.cpus for al in allocs if home is None or al.home == home),
        "devices": devices,
    }


def display_states(store: Any, runs: Iterable[Any]) -> dict[str, str]:
    """What `segue ls` shows for each run: RUNNING runs with a waiting request and no
    running step are WAITING, with their priority (a display state only)."""
    waiting = {r.run_id for r in store.list_requests()}
    out: dict[str, str] = {}
    for r in runs:
        prio = priority_name(int(r.options.get("priority", 100)))
        if r.state == RunState.RUNNING and r.run_id in waiting and not any(
                t.state.value == "RUNNING" for t in store.get_tasks(r.run_id)):
            out[r.run_id] = f"WAITING ({prio})"
        else:
            out[r.run_id] = r.state.value
    return out
