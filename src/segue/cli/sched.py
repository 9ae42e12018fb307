"""`segue queue` and `segue pool`: what waits for what, and who holds which device."""

from __future__ import annotations

import argparse
import os
import socket
import time
from typing import Any

from ..errors import UsageError
from ..flow.model import parse_memory
from ..home import Home
from ..scheduler.devices import detect_gpus, ensure_host, host_memory, virtual_gpus
from ..scheduler.policy import priority_name
from .render import fmt_time, print_json


def add_parsers(sub: Any) -> None:
    q = sub.add_parser("queue", help="what is waiting for resources, and why")
    q.add_argument("--json", action="store_true")
    p = sub.add_parser("pool", help="this host's devices and who holds them")
    p.add_argument("--json", action="store_true")
    psub = p.add_subparsers(dest="pool_cmd")
    s = psub.add_parser("set", help="configure this host's pool (virtual GPUs for machines without them)")
    s.add_argument("--gpus", type=int, required=True, help="number of (virtual) GPUs")
    s.add_argument("--gpu-mem", default="80GB", help="memory of each GPU (default 80GB)")
    s.add_argument("--cpus", type=float, default=None)
    s.add_argument("--memory", default=None, help="host memory, e.g. 64GB")
    psub.add_parser("detect", help="re-detect this host's GPUs (NVML or nvidia-smi)")


def _store(home: Home) -> Any:
    return home.open_store()


def cmd_queue(a: argparse.Namespace, home: Home) -> int:
    store = _store(home)
    reqs = store.list_requests()
    now = time.time()
    rows = [{
        "run_id": r.run_id, "step": r.step, "host": r.host, "priority": r.priority,
        "priority_class": priority_name(r.priority), "needs": r.need.describe(),
        "waiting_s": round(now - r.submitted_at, 3), "reason": r.reason,
    } for r in reqs]
    if a.json:
        print_json(rows)
        return 0
    if not rows:
        print("nothing is waiting")
    for r in rows:
        print(f"{r['run_id']}/{r['step']:<12} {r['priority_class']:<7} needs {r['needs']:<28} "
              f"waiting {r['waiting_s']:.1f}s: {r['reason']}")
    return 0


def cmd_pool(a: argparse.Namespace, home: Home) -> int:
    store = _store(home)
    host = socket.gethostname()
    if a.pool_cmd == "set":
        if a.gpus < 0:
            raise UsageError("--gpus must be >= 0")
        mem = parse_memory(a.gpu_mem, "--gpu-mem")
        store.configure_host(
            host, cpus=a.cpus or float(os.cpu_count() or 1),
            memory=parse_memory(a.memory, "--memory") if a.memory else host_memory(),
            devices=virtual_gpus(a.gpus, mem or 0), source="configured",
        )
    elif a.pool_cmd == "detect":
        source, devices = detect_gpus()
        store.configure_host(host, cpus=float(os.cpu_count() or 1), memory=host_memory(),
                             devices=devices, source=source)
    hp = ensure_host(store, host)
    allocs = store.list_allocations(host)
    holder = {d: al for al in allocs for d in al.devices}
    doc = {
        "host": host, "source": hp.source, "cpus": hp.cpus, "memory": hp.memory,
        "cpus_allocated": sum(al.cpus for al in allocs),
        "devices": [{
            "index": d.index, "name": d.name, "memory": d.memory, "virtual": d.virtual,
            "holder": None if d.index not in holder else {
                "run_id": holder[d.index].run_id, "step": holder[d.index].step,
                "priority": holder[d.index].priority, "since": holder[d.index].since,
            },
        } for d in hp.devices],
    }
    if a.json:
        print_json(doc)
        return 0
    print(f"host {host} ({hp.source}): {hp.cpus:g} cpus ({doc['cpus_allocated']:g} allocated), "
          f"{hp.memory / 2**30:.1f} GiB memory, {len(hp.devices)} gpus")
    for d in doc["devices"]:
        h = d["holder"]
        who = "free" if h is None else (f"{h['run_id']}/{h['step']} ({priority_name(h['priority'])}) "
                                        f"since {fmt_time(h['since'])}")
        print(f"  gpu {d['index']} {d['name']:<14} {d['memory'] / 2**30:6.1f} GiB  {who}")
    return 0
