"""Hosts on one machine that share a PostgreSQL store and an S3 bucket (the cluster
tests): each host is a home directory and a host id of its own, with its agent."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from segue_helpers import Segue, wait_for

from segue.store import Store

# The run's leases (seconds): a failover waits for the dead controller's to expire. Short,
# but long enough for a worker to start and send its first heartbeat on a loaded machine.
TTL = "5"
AGENT_TTL = "3"  # the agents' own leases in the store
QUICK = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05", "SEGUE_LEASE_TTL_S": TTL}


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]  # shared by every host: the store URL, the S3 credentials
    store: Store
    agents: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    # True: the hosts share the store's cluster-wide device pool; False: each host has a
    # pool file of its own (SEGUE_POOL), as hosts without shared devices would.
    cluster_pool: bool = False

    def home(self, host: str) -> Segue:
        s = Segue(self.root / host / "home")
        s.env.update(self.env)
        s.env["SEGUE_HOST_ID"] = host
        if self.cluster_pool:
            s.env.pop("SEGUE_POOL", None)  # the tests' session pool file would win
        else:
            s.env["SEGUE_POOL"] = str(self.root / host / "pool.db")
        return s

    def start_agent(self, host: str, env: dict[str, str] | None = None, ttl: str = AGENT_TTL) -> None:
        h = self.home(host)
        h.env.update(env or {})
        with open(self.root / f"agent-{host}.log", "a") as log:  # the child keeps its own descriptor
            self.agents[host] = subprocess.Popen(
                [sys.executable, "-m", "segue", "agent", "--host-id", host, "--ttl", ttl, "--poll", "0.2"],
                stdout=log, stderr=subprocess.STDOUT, text=True, env=h.env)
        pid = self.agents[host].pid
        wait_for(lambda: any(x.host == host and x.pid == pid and x.alive(self.store.now())
                             for x in self.store.list_hosts()), 60, f"host {host}'s agent to register")

    def stop(self) -> None:
        for p in self.agents.values():
            if p.poll() is None:
                p.kill()
            p.wait()
