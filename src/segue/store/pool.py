"""The resource-pool part of the store contract: devices, allocations, queue, statistics.

Allocations are what make "nothing is ever allocated twice" hold across
processes: a placement reads what is free and records the allocation in one
write transaction, together with the start of the attempt that uses it. An
allocation lives as long as its attempt's lease (heartbeats renew both), so a
crashed holder's devices return to the pool when its lease expires.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..scheduler.policy import Capacity, Need
from ..states import Actor
from .base import TaskRecord


@dataclass(frozen=True)
class DeviceRecord:
    host: str
    index: int
    name: str
    memory: int  # bytes
    virtual: bool


@dataclass(frozen=True)
class HostPool:
    host: str
    cpus: float
    memory: int
    source: str  # "nvml" | "nvidia-smi" | "configured" | "none"
    devices: tuple[DeviceRecord, ...]
    updated_at: float


@dataclass(frozen=True)
class AllocationRecord:
    id: int
    host: str
    run_id: str
    step: str
    epoch: int
    devices: tuple[int, ...]
    cpus: float
    memory: int
    priority: int
    preemptible: bool
    since: float
    lease_until: float
    released_at: float | None

    def live(self, at: float) -> bool:
        return self.released_at is None and self.lease_until > at


@dataclass(frozen=True)
class RequestRecord:
    run_id: str
    step: str
    host: str
    priority: int
    need: Need
    submitted_at: float
    reason: str
    lease_until: float


@dataclass(frozen=True)
class Placement:
    task: TaskRecord
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Denied:
    reason: str


class PoolStore(ABC):
    @abstractmethod
    def configure_host(
        self, host: str, *, cpus: float, memory: int,
        devices: Sequence[tuple[str, int, bool]], source: str,
    ) -> HostPool:
        """Set a host's capacity and devices ((name, memory bytes, virtual) each)."""

    @abstractmethod
    def get_host(self, host: str) -> HostPool | None: ...

    @abstractmethod
    def list_hosts(self) -> list[HostPool]: ...

    @abstractmethod
    def free_capacity(self, host: str) -> Capacity:
        """What no live allocation holds on the host right now."""

    @abstractmethod
    def try_start_attempt(
        self, run_id: str, step: str, *, host: str, need: Need, priority: int,
        preemptible: bool, ttl_s: float, actor: Actor,
    ) -> Placement | Denied:
        """Place ``need`` and start the attempt in one transaction, or say why not.

        Denied when it does not fit, or when a better-ranked live request
        (higher priority, or equal priority and older) would fit in the same
        free capacity: priority order, FIFO within a class.
        """

    @abstractmethod
    def release_allocation(self, run_id: str, step: str, epoch: int) -> AllocationRecord | None:
        """Return the attempt's resources (call once its process has exited)."""

    @abstractmethod
    def list_allocations(self, host: str | None = None, *, live_only: bool = True) -> list[AllocationRecord]:
        """Allocations, oldest first; with live_only=False the whole history."""

    @abstractmethod
    def upsert_request(
        self, run_id: str, step: str, *, host: str, need: Need, priority: int, reason: str,
        ttl_s: float,
    ) -> RequestRecord:
        """Record (or refresh) that a task waits for resources; keeps its submission time."""

    @abstractmethod
    def drop_request(self, run_id: str, step: str | None = None) -> None: ...

    @abstractmethod
    def list_requests(self, host: str | None = None) -> list[RequestRecord]:
        """Live waiting requests, best-ranked first."""

    @abstractmethod
    def add_stats(self, run_id: str, deltas: Mapping[str, float]) -> None: ...

    @abstractmethod
    def set_stats(self, run_id: str, values: Mapping[str, float]) -> None: ...

    @abstractmethod
    def get_stats(self, run_id: str) -> dict[str, float]: ...
