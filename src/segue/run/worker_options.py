"""The one record a controller hands each worker it starts (``WorkerOptions``).

Everything a worker must be told that is not in the store (which store, which
host it runs for, the devices and the pool allocation it was placed on) travels
in this record, as one JSON line on the worker's stdin (the executor writes it;
a store URL may hold a password: stdin is not world-readable, a command line
is). No ``SEGUE_*`` variable is set for a worker. Only the worker (``run``) reads
the record; it hands what lower layers need to them explicitly: the store to its
``Home``, the pool allocation and the sub-worker pool factory to the step's
context (segue.data takes them from there).

The Ray executor's node actor adds what it knows there (``"ray"``:
segue.executor.ray_attempt) before it writes the record on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import SegueError
from ..executor.ray_attempt import RayAttempt

VERSION = 1


@dataclass(frozen=True)
class WorkerOptions:
    store: str | None = field(default=None, repr=False)  # the home's store URL (None: SQLite); may hold a password
    host: str | None = None  # the host name the controller was given (None: the hostname)
    devices: tuple[int, ...] = ()  # the allocation's devices, in the pool's order
    pool: str | None = None  # the host pool: a file's path or a cluster's URL
    pool_home: str = ""  # how the pool names the run's home
    pool_host: str = ""  # the pool host the attempt was placed on
    ray: RayAttempt | None = None  # added by the Ray executor's node actor

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"v": VERSION, "store": self.store, "host": self.host,
                               "devices": list(self.devices), "pool": self.pool,
                               "pool_home": self.pool_home, "pool_host": self.pool_host}
        if self.ray is not None:
            doc["ray"] = self.ray.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> WorkerOptions:
        if not isinstance(doc, dict) or doc.get("v") != VERSION:
            got = doc.get("v") if isinstance(doc, dict) else type(doc).__name__
            raise SegueError(f"worker options record version {got!r} is not {VERSION}; the controller "
                             "and the worker run different segue versions")
        ray = doc.get("ray")
        return cls(store=doc.get("store") or None, host=doc.get("host") or None,
                   devices=tuple(int(d) for d in doc.get("devices", ())),
                   pool=doc.get("pool") or None, pool_home=str(doc.get("pool_home") or ""),
                   pool_host=str(doc.get("pool_host") or ""),
                   ray=RayAttempt.from_json(ray) if ray else None)
