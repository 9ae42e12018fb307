"""`segue queue` and `segue pool`: what waits for what, and who holds which device.

Both read the host pool, shared by every segue home on this machine (`--pool`
or $SEGUE_POOL picks another one), so they show the runs of other homes too.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Iterable
from typing import Any

from ..errors import UsageError
from ..flow.model import parse_memory
from ..home import Home
from ..scheduler.devices import (
    GpuProcesses,
    detect_gpus,
    ensure_host,
    gpu_processes,
    host_memory,
    virtual_gpus,
)
from ..scheduler.policy import priority_name
from ..states import RunState
from ..store.hostpool import open_pool
from ..store.pool import AllocationRecord, HostPool
from .render import fmt_time, print_json


def add_parsers(sub: Any) -> None:
    q = sub.add_parser("queue", help="what is waiting for resources, and why (every home)")
    q.add_argument("--json", action="store_true")
    p = sub.add_parser("pool", help="this host's devices and who holds them (every home)")
    p.add_argument("--json", action="store_true")
    psub = p.add_subparsers(dest="pool_cmd")
    s = psub.add_parser("set", help="configure this host's pool (virtual GPUs for machines without them)")
    s.add_argument("--gpus", type=int, required=True, help="number of (virtual) GPUs")
    s.add_argument("--gpu-mem", default="80GB", help="memory of each GPU (default 80GB)")
    s.add_argument("--cpus", type=float, default=None)
    s.add_argument("--memory", default=None, help="host memory, e.g. 64GB")
    d = psub.add_parser("detect", help="re-detect this host's GPUs (NVML or nvidia-smi)")
    d.add_argument("--replace", action="store_true",
                   help="replace configured virtual GPUs with what is detected")


def cmd_queue(a: argparse.Namespace, home: Home) -> int:
    reqs = open_pool().list_requests()
    now = time.time()
    rows = [{
        "home": r.home, "run_id": r.run_id, "step": r.step, "host": r.host,
        "priority": r.priority, "priority_class": priority_name(r.priority),
        "needs": r.need.describe(), "waiting_s": round(now - r.submitted_at, 3), "reason": r.reason,
    } for r in reqs]
    if a.json:
        print_json(rows)
        return 0
    if not rows:
        print("nothing is waiting")
    here = str(home.root)
    for r in rows:
        where = "" if r["home"] == here else f" (home {r['home']})"
        print(f"{r['run_id']}/{r['step']:<12} {r['priority_class']:<7} needs {r['needs']:<28} "
              f"waiting {r['waiting_s']:.1f}s: {r['reason']}{where}")
    return 0


def cmd_pool(a: argparse.Namespace, home: Home) -> int:
    pool = open_pool()
    host = socket.gethostname()
    if a.pool_cmd == "set":
        if a.gpus < 0:
            raise UsageError("--gpus must be >= 0")
        mem = parse_memory(a.gpu_mem, "--gpu-mem")
        if a.cpus is not None and not a.cpus > 0:
            raise UsageError("--cpus must be > 0")
        pool.configure_host(
            host, cpus=a.cpus or float(os.cpu_count() or 1),
            memory=(parse_memory(a.memory, "--memory") or 0) if a.memory else host_memory(),
            devices=virtual_gpus(a.gpus, mem or 0), source="configured",
        )
    elif a.pool_cmd == "detect":
        source, devices = detect_gpus()
        old = pool.get_host(host)
        virtual = [d for d in old.devices if d.virtual] if old else []
        if virtual and not a.replace:
            # Detection would silently drop what someone configured on purpose.
            raise UsageError(
                f"the pool of {host} has {len(virtual)} configured virtual gpu"
                f"{'' if len(virtual) == 1 else 's'} and detection found {len(devices)} "
                f"({source}); pass --replace to replace them, or keep them")
        pool.configure_host(host, cpus=old.cpus if old else float(os.cpu_count() or 1),
                            memory=host_memory(), devices=devices, source=source)
    hp = ensure_host(pool, host)
    doc = pool_doc(hp, pool.list_allocations(host), gpu_processes() if any(
        not d.virtual for d in hp.devices) else {}, home=str(home.root))
    doc["pool"] = str(pool.path)
    if a.json:
        print_json(doc)
        return 0
    print("\n".join(format_pool(doc)))
    return 0


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


def format_pool(doc: dict[str, Any]) -> list[str]:
    lines = [f"host {doc['host']} ({doc['source']}): {doc['cpus']:g} cpus "
             f"({doc['cpus_allocated']:g} allocated to this home), "
             f"{doc['memory'] / 2**30:.1f} GiB memory, "
             f"{len(doc['devices'])} gpus" + (f"; pool {doc['pool']}" if doc.get("pool") else "")]
    for d in doc["devices"]:
        h = d["holder"]
        if h is not None:
            who = (f"{h['run_id']}/{h['step']} ({priority_name(h['priority'])}) since "
                   f"{fmt_time(h['since'])}, home {h['home']}")
        elif d["busy_outside_pool"]:
            pids = ", ".join(f"{p['pid']} ({p['memory'] / 2**30:.1f} GiB)" for p in d["processes"])
            who = f"free in the pool but IN USE by processes outside it: pid {pids}"
        else:
            who = "free"
        lines.append(f"  gpu {d['index']} {d['name']:<14} {d['memory'] / 2**30:6.1f} GiB  {who}")
    return lines


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
