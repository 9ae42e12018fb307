"""`segue agent` (one per host: takes over runs whose controller died, fires schedules) and `segue hosts`."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from ..client.local import LocalClient
from ..errors import UsageError
from ..hostname import this_host, use_host
from .render import fmt_time, print_json


def add_parsers(sub: Any) -> None:
    a = sub.add_parser("agent", help="keep this host's runs alive: take over runs whose controller died; "
                                     "fire the store's schedules (`segue schedule`)")
    a.add_argument("--host-id", default=None,
                   help="this host's name in the store (default $SEGUE_HOST_ID, else the hostname)")
    a.add_argument("--ttl", type=float, default=None, metavar="S",
                   help="the host's lease in seconds (default 10)")
    a.add_argument("--poll", type=float, default=None, metavar="S",
                   help="how often to look for runs without a controller (default 1)")
    h = sub.add_parser("hosts", help="the hosts whose agents registered in this store")
    h.add_argument("--json", action="store_true")


def cmd_agent(a: argparse.Namespace, client: LocalClient) -> int:
    from ..run.hostagent import AGENT_TTL_S, POLL_S, HostAgent, serve_forever

    ttl = AGENT_TTL_S if a.ttl is None else a.ttl
    poll = POLL_S if a.poll is None else a.poll
    if not 0.5 <= ttl <= 3600:
        raise UsageError(f"--ttl must be between 0.5 and 3600 seconds, not {ttl}")
    if not 0 < poll <= ttl / 2:
        raise UsageError(f"--poll must be above 0 and at most half of --ttl ({ttl / 2:g}s), not {poll}")
    host = a.host_id or this_host()
    use_host(host)  # before anything records this host's name; its controllers are told it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    client.home.ensure()
    pool = client.pool()  # this host's devices, detected the first time
    info = {"cpus": pool.cpus, "memory": pool.memory, "gpus": len(pool.devices),
            "devices": [d.name for d in pool.devices], "home": str(client.home.root)}
    agent = HostAgent(home=client.home, store=client.store, host=host, pool=str(client.pool_path),
                      ttl_s=ttl, poll_s=poll, info=info)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda s, f: stop.set())
    signal.signal(signal.SIGINT, lambda s, f: stop.set())
    print(f"agent of host {host}: watching {client.home.root} (lease {ttl:g}s, poll {poll:g}s)", flush=True)
    return serve_forever(agent, stop)


def cmd_hosts(a: argparse.Namespace, client: LocalClient) -> int:
    store = client.store
    at = store.now()
    hosts = store.list_hosts()
    if a.json:
        print_json([{"host": h.host, "alive": h.alive(at), "epoch": h.epoch, "pid": h.pid, "info": h.info,
                     "started_at": h.started_at, "seen_at": h.seen_at, "lease_until": h.lease_until}
                    for h in hosts])
        return 0
    if not hosts:
        print("no host has registered an agent; start one with: segue agent")
        return 0
    for h in hosts:
        state = "alive" if h.alive(at) else "gone"
        print(f"{h.host:20} {state:6} pid {h.pid}  gpus {h.info.get('gpus', '?')}  "
              f"seen {fmt_time(h.seen_at)}  since {fmt_time(h.started_at)}")
    return 0
