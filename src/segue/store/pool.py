"""The host pool contract: devices, allocations, the queue and preemption requests.

Devices are a machine resource, so the pool is shared by every segue home on
the host (see :mod:`segue.store.hostpool` for where it lives). Runs are named
in it by ``(home, run_id)``: two homes may both have a run called ``train``.

Placement happens in two transactions on two databases, so it is made safe by
leases rather than by one transaction: the pool first allocates devices under
a short lease (``allocate``), the home store then starts the attempt (epoch +
1), and the pool binds the allocation to that epoch (``bind``). If starting
fails the allocation is released; if the process dies in between, the lease
runs out and the devices return by themselves. Nothing is ever allocated twice
because ``allocate`` reads the free capacity and inserts the allocation in one
``BEGIN IMMEDIATE`` transaction of the pool database.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..placement.policy import Capacity, Need
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
    home: str
    run_id: str
    step: str
    epoch: int | None  # None until the home store started the attempt (``bind``)
    devices: tuple[int, ...]
    cpus: float
    memory: int
    priority: int
    preemptible: bool
    since: float
    lease_until: float
    released_at: float | None
    ckpt_at: float | None  # the holder's last committed checkpoint (for victim choice)
    preemptions: int  # how often the holder's run was preempted before
    # Bytes it uses on each of its devices, which it shares with other such
    # allocations; None: it holds its devices whole (schema 3).
    gpu_memory: int | None = None
    # Elastic map steps (schema 4): each sub-worker uses ``per_worker`` devices and the
    # allocation may shrink to ``min_gpus`` devices without pausing the run (partial
    # preemption) or grow; None: it gives its devices back only whole. ``revoke``: the
    # devices a preemptor was promised, which the holder gives back at its next barrier.
    # ``parent``: the row this one resized (each resize closes a row and opens one, so
    # the history still shows every device's holders over time).
    per_worker: int | None = None
    min_gpus: int | None = None
    revoke: tuple[int, ...] = ()
    parent: int | None = None
    accelerator: str | None = None

    def live(self, at: float) -> bool:
        return self.released_at is None and self.lease_until > at

    @property
    def elastic(self) -> bool:
        return bool(self.per_worker) and self.min_gpus is not None

    def surplus_groups(self) -> list[tuple[int, ...]]:
        """The device groups (one per sub-worker) it may give up without pausing,
        last first, leaving out devices already promised to a preemptor."""
        if not self.elastic:
            return []
        g = int(self.per_worker or 0)
        groups = [self.devices[k:k + g] for k in range(0, len(self.devices), g)]
        revoked = set(self.revoke)
        kept = [grp for grp in groups if not revoked.intersection(grp)]
        may_go = len(kept) - max(1, -(-int(self.min_gpus or 0) // g))
        spare = kept[len(kept) - may_go:] if may_go > 0 else []
        return list(reversed(spare))


@dataclass(frozen=True)
class RequestRecord:
    home: str
    run_id: str
    step: str
    host: str
    priority: int
    need: Need
    submitted_at: float
    reason: str
    lease_until: float


@dataclass(frozen=True)
class PreemptionRequest:
    """Posted by a preemptor for a victim run; the victim's own controller acts on it."""

    id: int
    home: str
    run_id: str
    by_home: str
    by_run: str
    reason: str
    created_at: float
    lease_until: float
    outcome: str | None  # None while unhandled; "accepted" or "refused: ..."
    # A partial preemption names the devices to give back (the run keeps running on
    # the rest); None: pause the whole run (schema 4).
    devices: tuple[int, ...] | None = None


@dataclass(frozen=True)
class PoolChange:
    """Who changed a host's pool configuration (`segue pool set`, `PUT /api/pool`), and how."""

    id: int
    time: float
    host: str
    actor: str  # as run events name it: "cli", "api:alice"
    user: str  # the login name of the process that wrote it (the pool is the machine's)
    change: dict[str, Any]  # {"before": summary or None, "after": summary}; see hostpool.pool_summary


@dataclass(frozen=True)
class Allocated:
    id: int
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """A started attempt and the devices it holds."""

    task: TaskRecord
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Denied:
    reason: str
    never: bool = False  # it can never fit on this host as configured


class HostPoolStore(ABC):
    """The host-wide pool. Every method is one transaction."""

    path: Any  # where it lives; a worker opens the same pool from it
    cluster: bool = False  # one pool for every host of a shared store (PostgreSQL)

    @abstractmethod
    def configure_host(
        self, host: str, *, cpus: float, memory: int,
        devices: Sequence[tuple[str, int, bool]], source: str, actor: str | None = None,
        only_if_new: bool = False,
    ) -> HostPool:
        """Set a host's capacity and devices ((name, memory bytes, virtual) each). With
        ``actor`` (who asked), record the change in the same transaction (``pool_changes``).
        ``only_if_new``: a host already in the pool is returned as it is (detection
        never overwrites what someone configured meanwhile)."""

    @abstractmethod
    def pool_changes(self, host: str | None = None, *, limit: int = 100) -> list[PoolChange]:
        """Recorded configuration changes, newest first (of ``host``, or of every host)."""

    @abstractmethod
    def get_host(self, host: str) -> HostPool | None: ...

    @abstractmethod
    def list_hosts(self) -> list[HostPool]:
        """Every host configured in the pool, by name (one on a host-wide pool, usually)."""

    @abstractmethod
    def free_capacity(self, host: str, home: str | None = None) -> Capacity:
        """What no live allocation holds on the host right now: devices of every
        home; cpus and memory of ``home`` (of every home when None)."""

    @abstractmethod
    def allocate(
        self, home: str, run_id: str, step: str, *, host: str, need: Need, priority: int,
        preemptible: bool, ttl_s: float,
    ) -> Allocated | Denied:
        """Place ``need`` under a lease of ``ttl_s``, or say why not.

        Denied when it does not fit, or when a better-ranked live request
        (higher priority, or equal priority, older, and fitting) waits.

        A ``need`` with ``gpu_memory`` shares its devices: it fits a device that
        no allocation holds whole and whose sharers leave at least that many
        bytes; without, it needs devices nobody uses. Isolation: the read of the
        free capacity and the insert must be one serializable transaction (a
        backend without a single writer locks the host's allocation rows), so
        that no device is ever held whole twice, or oversubscribed.
        """

    @abstractmethod
    def bind(self, alloc_id: int, epoch: int, ttl_s: float) -> bool:
        """Tie a fresh allocation to the attempt's epoch; False if its lease ran out first."""

    @abstractmethod
    def renew(self, home: str, run_id: str, step: str, epoch: int, *, ttl_s: float,
              ckpt_at: float | None, preemptions: int) -> bool:
        """Extend a live allocation's lease; False if it is gone (released or expired)."""

    @abstractmethod
    def release(self, home: str, run_id: str, step: str, epoch: int) -> AllocationRecord | None:
        """Return the attempt's resources (call once its process has exited)."""

    @abstractmethod
    def release_id(self, alloc_id: int) -> None: ...

    @abstractmethod
    def list_allocations(self, host: str | None = None, *, live_only: bool = True
                         ) -> list[AllocationRecord]:
        """Allocations, oldest first; with live_only=False the whole history."""

    @abstractmethod
    def upsert_request(
        self, home: str, run_id: str, step: str, *, host: str, need: Need, priority: int,
        reason: str, ttl_s: float,
    ) -> RequestRecord:
        """Record (or refresh) that a task waits; a live request keeps its place in line."""

    @abstractmethod
    def drop_requests(self, home: str, run_id: str, step: str | None = None) -> None: ...

    @abstractmethod
    def list_requests(self, host: str | None = None) -> list[RequestRecord]:
        """Live waiting requests, best-ranked first."""

    @abstractmethod
    def request_preemption(self, home: str, run_id: str, *, by_home: str, by_run: str,
                           reason: str, ttl_s: float,
                           devices: Sequence[int] | None = None) -> PreemptionRequest:
        """Ask a victim's controller to pause its run, or with ``devices`` to give back
        only those devices of an elastic step (partial preemption)."""

    @abstractmethod
    def pending_preemptions(self, home: str, run_id: str) -> list[PreemptionRequest]:
        """Live, unhandled preemption requests for a run, oldest first."""

    @abstractmethod
    def preemption(self, request_id: int) -> PreemptionRequest | None: ...

    @abstractmethod
    def answer_preemption(self, request_id: int, outcome: str) -> None: ...

    # -- elastic steps (``workers=(min, max)``) ----------------------------------
    @abstractmethod
    def allocation(self, home: str, run_id: str, step: str, epoch: int) -> AllocationRecord | None:
        """The attempt's live allocation, or None."""

    @abstractmethod
    def grow(self, home: str, run_id: str, step: str, epoch: int, *, gpus: int,
             max_gpus: int) -> tuple[int, ...]:
        """Add up to ``gpus`` devices (whole sub-worker groups, at most ``max_gpus`` held in
        all) to an elastic allocation; the devices added, () if none. Growth is
        opportunistic: never while another run waits for devices on the host. Isolation
        as :meth:`allocate`."""

    @abstractmethod
    def shrink(self, home: str, run_id: str, step: str, epoch: int,
               devices: Sequence[int]) -> AllocationRecord | None:
        """Give ``devices`` back (the holder's sub-workers on them have stopped); the
        allocation now, or None if the attempt holds no live allocation."""

    @abstractmethod
    def revoke(self, home: str, run_id: str, devices: Sequence[int]) -> bool:
        """Promise ``devices`` of the run's elastic allocation to a preemptor: the holder
        sees them in ``revoke`` and shrinks at its next barrier. False if it holds none."""

    @abstractmethod
    def allocation_history(self, alloc_id: int) -> list[AllocationRecord]:
        """The rows an allocation went through by resizing, oldest first, ending at it."""

    @abstractmethod
    def park(self, home: str, run_id: str) -> None:
        """Remember a run paused by preemption, so any controller can wake it if its own dies."""

    @abstractmethod
    def unpark(self, home: str, run_id: str) -> None: ...

    @abstractmethod
    def parked(self) -> list[tuple[str, str]]:
        """(home, run_id) of runs paused by preemption, oldest first."""
