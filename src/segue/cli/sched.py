"""`segue queue` and `segue pool`: what waits for what, and who holds which device.

Both read the host pool, shared by every segue home on this machine (`--pool`
or $SEGUE_POOL picks another one), so they show the runs of other homes too.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..client.local import LocalClient
from ..errors import UsageError
from ..placement.policy import priority_name
from ..units import in_unit, parse_bytes
from .render import fmt_time, print_json


def add_parsers(sub: Any) -> None:
    q = sub.add_parser("queue", help="what is waiting for resources, and why (every home)")
    q.add_argument("--json", action="store_true")
    p = sub.add_parser("pool", help="this host's devices and who holds them (every home)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--all-hosts", action="store_true",
                   help="every host of a cluster-wide pool (a PostgreSQL store's), this one first")
    psub = p.add_subparsers(dest="pool_cmd")
    s = psub.add_parser("set", help="configure this host's pool (virtual GPUs for machines without them)")
    s.add_argument("--gpus", type=int, default=None, help="number of (virtual) GPUs")
    s.add_argument("--gpu-mem", default="80GB",
                   help="memory of each GPU: 80GB is 10^9 bytes each, 80GiB 2^30 (default 80GB)")
    s.add_argument("--gpu-type", default=None,
                   help="their device type, e.g. rtx-pro-6000 or h100 (for steps with accelerator=)")
    s.add_argument("--group", action="append", default=[], metavar="COUNTxMEM[:TYPE]",
                   help="more GPUs of another kind, e.g. 2x24GB:l4 (repeatable)")
    s.add_argument("--cpus", type=float, default=None)
    s.add_argument("--memory", default=None, help="host memory, e.g. 64GB (10^9 bytes) or 64GiB (2^30)")
    d = psub.add_parser("detect", help="re-detect this host's GPUs (NVML or nvidia-smi)")
    d.add_argument("--replace", action="store_true",
                   help="replace configured virtual GPUs with what is detected")


def cmd_queue(a: argparse.Namespace, client: LocalClient) -> int:
    rows = [q.to_json() for q in client.queue()]
    if a.json:
        print_json(rows)
        return 0
    if not rows:
        print("nothing is waiting")
    here = client.pool_home
    for r in rows:
        where = "" if r["home"] == here else f" (home {r['home']})"
        print(f"{r['run_id']}/{r['step']:<12} {r['priority_class']:<7} needs {r['needs']:<28} "
              f"waiting {r['waiting_s']:.1f}s: {r['reason']}{where}")
    return 0


def cmd_pool(a: argparse.Namespace, client: LocalClient) -> int:
    if a.pool_cmd == "set":
        from ..scheduler.devices import parse_group

        if a.gpus is None and not a.group:
            raise UsageError("segue pool set needs --gpus N (or --group COUNTxMEM[:TYPE])")
        if a.gpus is not None and a.gpus < 0:
            raise UsageError("--gpus must be >= 0")
        view = client.configure_pool(gpus=a.gpus or 0,
                                     gpu_memory=parse_bytes(a.gpu_mem, "--gpu-mem", error=UsageError),
                                     cpus=a.cpus, gpu_type=a.gpu_type,
                                     groups=[parse_group(g) for g in a.group],
                                     memory=None if a.memory is None else parse_bytes(a.memory, "--memory",
                                                                                      error=UsageError))
    elif a.pool_cmd == "detect":
        view = client.detect_pool(replace=a.replace)
    elif a.all_hosts:
        docs = [v.to_json() for v in client.pools()]
        if a.json:
            print_json(docs)
        else:
            print("\n".join(line for d in docs for line in format_pool(d)))
        return 0
    else:
        view = client.pool()
    if a.json:
        print_json(view.to_json())
    else:
        print("\n".join(format_pool(view.to_json())))
    return 0


def format_pool(doc: dict[str, Any]) -> list[str]:
    lines = [f"host {doc['host']} ({doc['source']}): {doc['cpus']:g} cpus "
             f"({doc['cpus_allocated']:g} allocated to this home), "
             f"{in_unit(doc['memory'], 'GiB', 1)} memory, "
             f"{len(doc['devices'])} gpus" + (f"; pool {doc['pool']}" if doc.get("pool") else "")]
    for d in doc["devices"]:
        h = d["holder"]
        shared = [x for x in d.get("holders") or [] if x.get("gpu_memory")]
        if shared:
            each = "; ".join(f"{x['run_id']}/{x['step']} {in_unit(x['gpu_memory'], 'GiB', 0)} "
                             f"({priority_name(x['priority'])}) since {fmt_time(x['since'])}" for x in shared)
            who = f"shared, {in_unit(d['free_memory'], 'GiB', 1)} free: {each}"
        elif h is not None:
            who = (f"{h['run_id']}/{h['step']} ({priority_name(h['priority'])}) since "
                   f"{fmt_time(h['since'])}, home {h['home']}")
        elif d["busy_outside_pool"]:
            pids = ", ".join(f"{p['pid']} ({in_unit(p['memory'], 'GiB', 1)})" for p in d["processes"])
            who = f"free in the pool but IN USE by processes outside it: pid {pids}"
        else:
            who = "free"
        lines.append(f"  gpu {d['index']} {d['name']:<14} {in_unit(d['memory'], 'GiB', 1):>10}  {who}")
    return lines
