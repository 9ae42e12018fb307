"""What `segue pool`, `segue queue`, `segue ls` and `segue status` show of the scheduler:
documents built from the pool and store."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..placement.policy import kind_matches, priority_name
from ..states import RunState
from ..store.hostpool import kinds
from ..store.pool import AllocationRecord, HostPool, RequestRecord
from .devices import GpuProcesses


def pool_doc(hp: HostPool, allocs: Iterable[AllocationRecord], procs: GpuProcesses,
             home: str | None = None) -> dict[str, Any]:
    """The pool as `segue pool --json` shows it.

    ``procs``: what the driver reports on each physical device; a device in
    use by processes while segue allocated it to nobody is marked ``busy``
    (something outside segue, or a segue run of another pool, uses it).
    """
    allocs = list(allocs)
    on: dict[int, list[AllocationRecord]] = {}
    for al in sorted(allocs, key=lambda a: a.since):
        for i in al.devices:
            on.setdefault(i, []).append(al)
    devices = []
    for d in hp.devices:
        hs = on.get(d.index, [])
        others = [] if d.virtual else procs.get(d.index, [])
        whole = any(h.gpu_memory is None for h in hs)
        devices.append({
            "index": d.index, "name": d.name, "memory": d.memory, "virtual": d.virtual,
            "holder": _holder(hs[0]) if hs else None,  # the first, for readers of one holder
            # Every allocation on it: one that holds it whole, or the steps sharing it by memory.
            "holders": [_holder(h) for h in hs],
            "free_memory": 0 if whole else max(0, d.memory - sum(h.gpu_memory or 0 for h in hs)),
            "processes": [{"pid": pid, "memory": mem} for pid, mem in others],
            "busy_outside_pool": not hs and bool(others),
        })
    return {
        "host": hp.host, "source": hp.source, "cpus": hp.cpus, "memory": hp.memory,
        # cpus are budgeted per home (devices are the machine's): this home's share
        "cpus_allocated": sum(al.cpus for al in allocs if home is None or al.home == home),
        "devices": devices,
    }


def _holder(h: AllocationRecord) -> dict[str, Any]:
    return {"home": h.home, "run_id": h.run_id, "step": h.step, "priority": h.priority, "since": h.since,
            "gpu_memory": h.gpu_memory}


def pinned_holders(r: RequestRecord, allocs: Iterable[AllocationRecord], hp: HostPool | None) -> str:
    """What `segue queue` adds to a GPU request's reason: the runs holding devices it
    could use that cannot be preempted (no priority frees them), or "" for none."""
    if not r.need.gpus:
        return ""
    kind = kinds(hp) if hp is not None else {}
    said = []
    for a in sorted(allocs, key=lambda a: (a.devices, a.since)):
        if a.preemptible or (a.home, a.run_id) == (r.home, r.run_id):
            continue
        devs = [i for i in a.devices if kind_matches(kind.get(i, ""), r.need.accelerator)]
        if not devs:
            continue
        where = "" if a.home == r.home else f" of home {a.home}"
        said.append(f"gpu {', '.join(map(str, devs))} held by run {a.run_id!r}{where} (step "
                    f"{a.step!r}, {priority_name(a.priority)}), which is not preemptible")
    return "; " + "; ".join(said) if said else ""


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
