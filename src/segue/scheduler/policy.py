"""Scheduling policy as pure functions: priorities, fitting, victims, aging.

Nothing here reads a clock or a database; callers pass the facts in. That
keeps every decision testable with made-up times (virtual time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from ..flow.model import StepSpec

PRIORITY_CLASSES: dict[str, int] = {"urgent": 300, "high": 200, "normal": 100, "batch": 0}
CLASS_STEP = 100
AGING_CAP = PRIORITY_CLASSES["high"]


MAX_PRIORITY = 10**6  # |priority| at most this: it must fit the pool's columns and aging sums


def parse_priority(value: str | int) -> int:
    """'urgent' | 'high' | 'normal' | 'batch' or an integer -> an integer priority."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        text = str(value).strip().lower()
        if text in PRIORITY_CLASSES:
            return PRIORITY_CLASSES[text]
        try:
            number = int(text)
        except ValueError:
            names = ", ".join(PRIORITY_CLASSES)
            raise UsageError(f"priority {value!r} is unknown; use one of {names} or an integer") from None
    if abs(number) > MAX_PRIORITY:
        raise UsageError(f"priority {value!r} is out of range; use {-MAX_PRIORITY} to {MAX_PRIORITY}")
    return number


def priority_name(priority: int) -> str:
    for name, value in PRIORITY_CLASSES.items():
        if priority == value:
            return name
    return str(priority)


def priority_class(priority: int) -> str:
    """The class whose band holds ``priority``: the highest class at or below it."""
    at_or_below = [(v, n) for n, v in PRIORITY_CLASSES.items() if v <= priority]
    return max(at_or_below)[1] if at_or_below else "batch"


def default_preemptible(priority: int) -> bool:
    """batch and normal runs may be paused for more urgent work; high and urgent may not."""
    return priority < PRIORITY_CLASSES["high"]


def effective_priority(base: int, waited_s: float, max_pause_s: float) -> int:
    """Aging: a run paused by preemption for longer than ``max_pause_s`` gains one
    class per such period, up to ``high``, so it cannot starve behind a stream
    of higher-priority work. ``max_pause_s <= 0`` disables aging."""
    if max_pause_s <= 0 or waited_s < max_pause_s:
        return base
    bumped = base + CLASS_STEP * math.floor(waited_s / max_pause_s)
    return max(base, min(bumped, AGING_CAP))


@dataclass(frozen=True)
class Device:
    index: int
    memory: int  # bytes


@dataclass(frozen=True)
class Need:
    gpus: int = 0
    gpu_memory: int | None = None  # bytes per device, at least
    cpus: float = 0.0
    memory: int = 0

    def describe(self) -> str:
        parts = []
        if self.gpus:
            mem = f" with >= {self.gpu_memory / 2**30:.0f} GiB" if self.gpu_memory else ""
            parts.append(f"{self.gpus} gpu{'s' if self.gpus > 1 else ''}{mem}")
        if self.cpus:
            parts.append(f"{self.cpus:g} cpu")
        if self.memory:
            parts.append(f"{self.memory / 2**30:.1f} GiB memory")
        return ", ".join(parts) or "nothing"


@dataclass(frozen=True)
class Capacity:
    """What is free on a host."""

    devices: tuple[Device, ...]
    cpus: float
    memory: int

    def plus(self, devices: Iterable[Device], cpus: float, memory: int) -> Capacity:
        have = {d.index for d in self.devices}
        extra = tuple(d for d in devices if d.index not in have)
        return Capacity(self.devices + extra, self.cpus + cpus, self.memory + memory)


def fit_devices(free: Sequence[Device], gpus: int, gpu_memory: int | None) -> list[int] | None:
    """Right fitting: the smallest devices that are big enough, lowest index first."""
    if gpus <= 0:
        return []
    big_enough = sorted((d for d in free if d.memory >= (gpu_memory or 0)),
                        key=lambda d: (d.memory, d.index))
    if len(big_enough) < gpus:
        return None
    return sorted(d.index for d in big_enough[:gpus])


def place(need: Need, free: Capacity) -> list[int] | None:
    """The devices to give ``need``, or None if it does not fit."""
    if need.cpus > free.cpus + 1e-9 or need.memory > free.memory:
        return None
    return fit_devices(free.devices, need.gpus, need.gpu_memory)


@dataclass(frozen=True)
class Holder:
    """A run holding resources on the host, as a preemption candidate."""

    run_id: str
    priority: int
    preemptible: bool
    devices: tuple[Device, ...]
    cpus: float
    memory: int
    work_lost_s: float  # time since its last committed checkpoint
    preemptions: int  # how often it was preempted before
    steps: tuple[str, ...] = field(default=())
    home: str = ""  # the segue home the run belongs to (the pool is shared by every home)

    def key(self) -> tuple[int, float, int, str]:
        return (self.priority, self.work_lost_s, self.preemptions, self.run_id)


def choose_victims(
    need: Need, free: Capacity, holders: Sequence[Holder], requester_priority: int
) -> list[Holder] | None:
    """Runs to pause so that ``need`` fits: [] if it fits already, None if impossible.

    Candidates are preemptible runs of strictly lower priority, taken in order
    of lowest priority, then least work lost, then least preempted so far.
    Victims that turn out unnecessary are dropped again (latest first).
    """
    if place(need, free) is not None:
        return []
    candidates = sorted((h for h in holders if h.preemptible and h.priority < requester_priority),
                        key=Holder.key)
    chosen: list[Holder] = []
    cap = free
    for h in candidates:
        chosen.append(h)
        cap = cap.plus(h.devices, h.cpus, h.memory)
        if place(need, cap) is not None:
            break
    else:
        return None
    for h in reversed(list(chosen)):
        rest = [x for x in chosen if x is not h]
        trial = free
        for x in rest:
            trial = trial.plus(x.devices, x.cpus, x.memory)
        if place(need, trial) is not None:
            chosen = rest
    return chosen


def step_need(steps: Mapping[str, StepSpec], step: str, gpus_override: int = -1,
              gpu_memory_override: int = 0) -> Need:
    """What one attempt of ``step`` asks the pool for, after the run's --gpus/--gpu-mem.

    ``--gpus N`` applies to the steps that declare GPUs, or to every step when
    none does (a flow written without GPUs run on N devices).
    """
    r = steps[step].resources
    gpus = r.gpus
    any_gpu = any(s.resources.gpus for s in steps.values())
    if gpus_override >= 0 and (r.gpus > 0 or not any_gpu):
        gpus = gpus_override
    mem = gpu_memory_override or r.gpu_memory
    return Need(gpus=gpus, gpu_memory=mem if gpus else None, cpus=r.cpus, memory=r.memory or 0)
