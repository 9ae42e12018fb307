"""The typed records the client returns, with their JSON form.

Every record converts both ways (``to_json`` / ``from_json``), so a client
talking to a home and one talking to `segue server` return equal records:
the server sends ``to_json()`` and the HTTP client rebuilds the record.
Events, checkpoints and metric points are the store's own records (``segue.store.base``), and
so are pool changes (``segue.store.pool``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..states import RunState
from ..store.base import CheckpointRecord, Event, MetricPoint
from ..store.pool import PoolChange

__all__ = [
    "CheckpointRecord", "DeviceView", "Event", "MetricPoint", "PoolChange", "PoolView", "QueueEntry",
    "RunStatus", "RunSummary", "StepStatus", "checkpoint_from_json", "event_from_json",
    "metric_point_from_json", "pool_change_from_json",
]


@dataclass(frozen=True)
class RunSummary:
    """One line of ``Client.runs()``: a run as `segue ls` shows it."""

    run_id: str
    state: RunState
    shown: str  # what `segue ls` prints: the state, or "WAITING (batch)" for a run without a device
    priority: int
    flow: str
    created_at: float
    updated_at: float

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "state": self.state.value}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunSummary:
        return cls(**{**_known(cls, d), "state": RunState(d["state"])})


@dataclass(frozen=True)
class StepStatus:
    """One step of a run, as ``segue status`` shows it."""

    name: str
    state: str
    progress: dict[str, Any]  # {"done", "total", "unit"}: unit is "records", "bytes" or None
    attempts: int
    failures: int
    epoch: int
    last_checkpoint: dict[str, Any] | None  # {"time", "seq", "position", "bytes"}
    pid: int | None
    error: str | None
    waiting_for: str | None  # why the step waits for devices, when it does
    last_failure: dict[str, Any] | None  # the traceback tail of the last failed attempt
    # While RUNNING: the attempt's last heartbeat (store clock); None from older servers.
    last_heartbeat: float | None = None
    # Errors of earlier attempts, oldest first ({"time", "epoch", "attempt", "error"});
    # ``error`` is only the one that put the step in its state.
    earlier_errors: list[dict[str, Any]] = field(default_factory=list)
    # A step reading a message queue: its lag as last reported (run.status.queue_lag).
    queue: dict[str, Any] | None = None
    # A fan-out or a loop: its tasks (NAME.K), folded: {"total", "states": {STATE: n},
    # "tasks": [StepStatus-like dicts of those running or failing], "more": n}.
    items: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepStatus:
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class RunStatus:
    """What ``segue status --json`` prints: the run, its steps and its accounting."""

    run_id: str
    state: RunState
    priority: int
    flow: str
    flow_path: str
    params: dict[str, Any]
    created_at: float
    updated_at: float
    controller: dict[str, Any]  # {"pid", "host", "alive", "lease_until"}
    problem: str | None  # set when the run looks alive but nothing drives it
    steps: list[StepStatus]
    accounting: dict[str, Any]  # every figure is defined in docs/accounting.md
    shown: str = ""  # what `segue ls` shows: the state, or "WAITING (batch)"; "" from older servers

    def step(self, name: str) -> StepStatus:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"run {self.run_id!r} has no step {name!r}")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["state"] = self.state.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunStatus:
        return cls(**{**_known(cls, d), "state": RunState(d["state"]),
                      "steps": [StepStatus.from_json(s) for s in d["steps"]]})


@dataclass(frozen=True)
class DeviceView:
    index: int
    name: str
    memory: int
    virtual: bool
    holder: dict[str, Any] | None  # {"home", "run_id", "step", "priority", "since", "gpu_memory"}
    processes: list[dict[str, Any]] = field(default_factory=list)  # what the driver sees on it
    busy_outside_pool: bool = False
    # Every allocation on the device (several when steps share it by memory; gpu_memory
    # None: held whole) and the memory they leave free (0 when held whole).
    holders: list[dict[str, Any]] = field(default_factory=list)
    free_memory: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DeviceView:
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class PoolView:
    """This host's devices and who holds them (the pool is shared by every home)."""

    host: str
    source: str
    cpus: float
    memory: int
    cpus_allocated: float
    devices: list[DeviceView]
    pool: str  # the pool database's path

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PoolView:
        return cls(**{**_known(cls, d), "devices": [DeviceView.from_json(x) for x in d["devices"]]})


@dataclass(frozen=True)
class QueueEntry:
    """A step waiting for devices, and why."""

    home: str
    run_id: str
    step: str
    host: str
    priority: int
    priority_class: str
    needs: str
    waiting_s: float
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QueueEntry:
        return cls(**_known(cls, d))


def event_from_json(d: dict[str, Any]) -> Event:
    return Event(**_known(Event, d))


def checkpoint_from_json(d: dict[str, Any]) -> CheckpointRecord:
    return CheckpointRecord(**_known(CheckpointRecord, d))


def metric_point_from_json(d: dict[str, Any]) -> MetricPoint:
    return MetricPoint(**_known(MetricPoint, d))


def pool_change_from_json(d: dict[str, Any]) -> PoolChange:
    return PoolChange(**_known(PoolChange, d))


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``d`` that are fields of ``cls`` (a newer server may send more)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}
