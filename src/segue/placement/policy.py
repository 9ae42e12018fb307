"""Scheduling policy as pure functions: priorities, fitting, victims, aging.

Nothing here reads a clock or a database; callers pass the facts in. That
keeps every decision testable with made-up times (virtual time).
"""

from __future__ import annotations

import math
import re
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


GIB = 2**30


def gib(nbytes: int) -> str:
    """Bytes as GiB for messages: '40 GiB', '15.5 GiB'."""
    v = nbytes / GIB
    return f"{v:.0f} GiB" if abs(v - round(v)) < 0.05 else f"{v:.1f} GiB"


# Hints a user may write for a catalog type (``accelerator="rtx-pro-6000"``).
ACCELERATOR_ALIASES: dict[str, str] = {"rtx-pro-6000": "rtx-pro-6000-blackwell",
                                       "rtxpro6000": "rtx-pro-6000-blackwell"}


def canonical_accelerator(hint: str) -> str:
    """A step's ``accelerator=`` hint as a device type key: lower case, words joined by
    '-', 'nvidia' dropped, aliases resolved ('RTX PRO 6000' -> 'rtx-pro-6000-blackwell')."""
    low = re.sub(r"[^a-z0-9.]+", "-", str(hint).lower()).strip("-")
    low = re.sub(r"^nvidia-", "", low)
    return ACCELERATOR_ALIASES.get(low, low)


def device_kind(name: str, memory: int, virtual: bool) -> str:
    """The type a device is matched by against ``accelerator=`` hints.

    A real device's type is its catalog key (``pricing.device_type``). A virtual
    device configured with a type (``segue pool set --gpu-type h100``) is named by
    that type and matches it; an untyped one (``virtual-N``) is of type 'virtual'.
    Accounting keeps pricing every virtual device as 'virtual' (free).
    """
    from .pricing import VIRTUAL, device_type

    if virtual and (not name or name.startswith("virtual-")):
        return VIRTUAL
    return device_type(name, memory, False)


def kind_matches(kind: str, accelerator: str | None) -> bool:
    """Does a device of type ``kind`` satisfy the hint? Exact, or the hint names a family
    ('a100' matches 'a100-80gb', 'rtx-pro-6000' matches 'rtx-pro-6000-blackwell')."""
    if not accelerator:
        return True
    return kind == accelerator or kind.startswith(accelerator + "-")


@dataclass(frozen=True)
class Device:
    """A device as placement sees it.

    In a :class:`Capacity`, a device listed is not held whole by anyone:
    ``free`` is the memory no sharer uses (None: all of it) and ``sharers`` how
    many allocations share it now. A device held whole (exclusively) is not
    listed at all.
    """

    index: int
    memory: int  # bytes
    free: int | None = None  # bytes not used by sharers; None: the whole device
    sharers: int = 0
    kind: str = ""  # device_kind(); "" when unknown (matches only steps without a hint)

    @property
    def available(self) -> int:
        return self.memory if self.free is None else self.free

    @property
    def whole(self) -> bool:
        """Nobody uses any of it: an exclusive step may take it."""
        return self.sharers == 0


@dataclass(frozen=True)
class Need:
    """What one attempt asks for. With ``gpu_memory`` it uses that many bytes on each of
    its ``gpus`` devices and may share them with other such attempts; without, it
    takes its devices whole."""

    gpus: int = 0
    gpu_memory: int | None = None  # bytes used on each device; None: the devices whole
    cpus: float = 0.0
    memory: int = 0
    accelerator: str | None = None  # a device type key (canonical_accelerator)
    # An elastic map step (``workers=(min, max)``): each sub-worker uses this many of
    # the devices; ``gpus`` is what its ``min`` sub-workers need. 0: not elastic.
    per_worker: int = 0

    @property
    def shares(self) -> bool:
        return bool(self.gpus and self.gpu_memory)

    def describe_gpus(self) -> str:
        if not self.gpus:
            return ""
        n = f"{self.gpus} {self.accelerator + ' ' if self.accelerator else ''}gpu" \
            f"{'s' if self.gpus > 1 else ''}"
        if self.gpu_memory:
            return f"{gib(self.gpu_memory)} on {'each of ' if self.gpus > 1 else ''}{n}"
        return n

    def describe(self) -> str:
        parts = []
        if self.gpus:
            parts.append(self.describe_gpus())
        if self.cpus:
            parts.append(f"{self.cpus:g} cpu")
        if self.memory:
            parts.append(f"{self.memory / 2**30:.1f} GiB memory")
        return ", ".join(parts) or "nothing"


@dataclass(frozen=True)
class Capacity:
    """What is free on a host: devices not held whole (with the memory sharers leave),
    cpus and memory."""

    devices: tuple[Device, ...]
    cpus: float
    memory: int

    def plus(self, devices: Iterable[Device], cpus: float, memory: int,
             shares: Iterable[tuple[int, int]] = ()) -> Capacity:
        """The capacity once a holder lets go: ``devices`` it held whole come back whole;
        each ``(device, bytes)`` it shared gives those bytes back to that device."""
        by_index = {d.index: d for d in self.devices}
        for d in devices:
            if d.index not in by_index:
                by_index[d.index] = Device(d.index, d.memory, kind=d.kind)
        for index, used in shares:
            shared = by_index.get(index)
            if shared is None:
                continue  # not a device of this host (any more)
            sharers = max(0, shared.sharers - 1)
            free = shared.memory if sharers == 0 else min(shared.memory, shared.available + used)
            by_index[index] = Device(index, shared.memory, free, sharers, shared.kind)
        return Capacity(tuple(sorted(by_index.values(), key=lambda d: d.index)),
                        self.cpus + cpus, self.memory + memory)

    def best_free(self, accelerator: str | None = None) -> Device | None:
        """The device with the most memory free (of the type asked), for messages."""
        match = [d for d in self.devices if kind_matches(d.kind, accelerator)]
        return max(match, key=lambda d: (d.available, -d.index)) if match else None


def fit_devices(free: Sequence[Device], gpus: int, gpu_memory: int | None,
                accelerator: str | None = None) -> list[int] | None:
    """Right fitting. The rule:

    * a step without ``gpu_memory`` takes devices whole: the smallest wholly free
      devices (of the type asked), so big devices stay free for big steps;
    * a step with ``gpu_memory`` shares: on each device it goes where it leaves
      the least memory free (best fit), so partly used devices fill up first and
      empty ones stay empty for whole or big steps; ties go to the smaller
      device, then the lower index.

    Never oversubscribes: a sharer only goes where ``gpu_memory <= free``.
    """
    if gpus <= 0:
        return []
    typed = [d for d in free if kind_matches(d.kind, accelerator)]
    if gpu_memory:
        fits = [d for d in typed if d.available >= gpu_memory]
        order = sorted(fits, key=lambda d: (d.available - gpu_memory, d.memory, d.index))
    else:
        order = sorted((d for d in typed if d.whole), key=lambda d: (d.memory, d.index))
    if len(order) < gpus:
        return None
    return sorted(d.index for d in order[:gpus])


def place(need: Need, free: Capacity) -> list[int] | None:
    """The devices to give ``need``, or None if it does not fit."""
    if need.cpus > free.cpus + 1e-9 or need.memory > free.memory:
        return None
    return fit_devices(free.devices, need.gpus, need.gpu_memory, need.accelerator)


def wait_reason(need: Need, free: Capacity) -> str:
    """Why ``need`` does not fit ``free`` now, in one line (for `segue queue`)."""
    if need.cpus > free.cpus + 1e-9 or need.memory > free.memory or not need.shares:
        whole = sum(1 for d in free.devices if d.whole)
        return (f"waiting for {need.describe()}; free now: {whole} gpus, {free.cpus:g} cpus, "
                f"{free.memory / 2**30:.1f} GiB memory")
    best = free.best_free(need.accelerator)
    if best is None:
        where = "every gpu is held whole" if not need.accelerator else \
            f"every {need.accelerator} gpu is held whole"
    else:
        where = f"best free: {gib(best.available)} on gpu {best.index}"
    return f"waiting for {need.describe_gpus()} ({where})"


@dataclass(frozen=True)
class Holder:
    """A run holding resources on the host, as a preemption candidate."""

    run_id: str
    priority: int
    preemptible: bool
    devices: tuple[Device, ...]  # devices it holds whole
    cpus: float
    memory: int
    work_lost_s: float  # time since its last committed checkpoint
    preemptions: int  # how often it was preempted before
    steps: tuple[str, ...] = field(default=())
    home: str = ""  # the segue home the run belongs to (the pool is shared by every home)
    shares: tuple[tuple[int, int], ...] = field(default=())  # (device, bytes) it shares
    # A partial candidate: one sub-worker's devices of this elastic step, which the run
    # gives back at its next checkpoint barrier while it keeps running. None: the
    # candidate is the whole run (it pauses).
    partial: str | None = None

    def key(self) -> tuple[int, int, float, int, str]:
        # Same priority: give up a sub-worker's devices before pausing a whole run.
        return (self.priority, 0 if self.partial else 1, self.work_lost_s, self.preemptions,
                self.run_id)

    @property
    def run(self) -> tuple[str, str]:
        return (self.home, self.run_id)


def _freed(free: Capacity, victims: Iterable[Holder]) -> Capacity:
    cap = free
    for h in _whole_first(list(victims)):
        cap = cap.plus(h.devices, h.cpus, h.memory, h.shares)
    return cap


def _greedy(need: Need, free: Capacity, candidates: Sequence[Holder]) -> list[Holder] | None:
    """Take candidates in order until ``need`` fits, then drop those not needed (latest first)."""
    chosen: list[Holder] = []
    for h in candidates:
        chosen.append(h)
        if place(need, _freed(free, chosen)) is not None:
            break
    else:
        return None
    for h in reversed(list(chosen)):
        rest = [x for x in chosen if x is not h]
        if place(need, _freed(free, rest)) is not None:
            chosen = rest
    return chosen


def choose_victims(
    need: Need, free: Capacity, holders: Sequence[Holder], requester_priority: int
) -> list[Holder] | None:
    """Runs to pause so that ``need`` fits: [] if it fits already, None if impossible.

    Candidates are preemptible runs of strictly lower priority, taken in order
    of lowest priority, then least work lost, then least preempted so far. An
    elastic map step's spare sub-workers are candidates too (``partial``): at
    the same priority, giving up some of a run's devices comes before pausing
    any run, and the set kept pauses as few runs as it can.
    Victims that turn out unnecessary are dropped again (latest first).

    Memory is freed per device: a sharer's release gives back its bytes, not
    the device. So the victims may be chosen among the holders of one device
    only (for each device in turn) as well as among all; of those sets the one
    kept pauses nothing of a higher priority than it must, then the fewest
    runs, then the least work lost, then the least preempted.
    """
    if place(need, free) is not None:
        return []
    candidates = sorted((h for h in holders if h.preemptible and h.priority < requester_priority),
                        key=Holder.key)
    options = [_greedy(need, free, candidates)]
    if need.gpus == 1:
        for index in sorted({i for h in candidates for i in _touched(h)}):
            options.append(_greedy(need, free, [h for h in candidates if index in _touched(h)]))
    found = [_whole_first(o) for o in options if o is not None]
    if not found:
        return None

    def rank(vs: list[Holder]) -> tuple[int, int, int, float, int, list[str]]:
        paused = [v for v in vs if v.partial is None]
        return (max(v.priority for v in vs), len(paused), len(vs),
                sum(v.work_lost_s for v in paused), sum(v.preemptions for v in paused),
                sorted(v.run_id for v in vs))

    return min(found, key=rank)


def _whole_first(victims: list[Holder]) -> list[Holder]:
    """A run paused whole gives everything back: drop its partial candidates."""
    paused = {v.run for v in victims if v.partial is None}
    return [v for v in victims if v.partial is None or v.run not in paused]


def _touched(h: Holder) -> set[int]:
    return {d.index for d in h.devices} | {i for i, _ in h.shares}


def step_need(steps: Mapping[str, StepSpec], step: str, gpus_override: int = -1,
              gpu_memory_override: int = 0) -> Need:
    """What one attempt of ``step`` asks the pool for, after the run's --gpus/--gpu-mem.

    ``--gpus N`` applies to the steps that declare GPUs, or to every step when
    none does (a flow written without GPUs run on N devices).

    A map step with sub-workers (``workers=N`` or ``(min, max)``) asks for
    ``gpus`` per sub-worker: N of them, or ``min`` of them for an elastic step,
    which grows later by itself (``Need.per_worker``).
    """
    r = steps[step].resources
    gpus = r.gpus
    any_gpu = any(s.resources.gpus for s in steps.values())
    if gpus_override >= 0 and (r.gpus > 0 or not any_gpu):
        gpus = gpus_override
    mem = gpu_memory_override or r.gpu_memory
    hint = r.accelerator
    low, high = r.workers
    return Need(gpus=gpus * low, gpu_memory=mem if gpus else None, cpus=r.cpus,
                memory=r.memory or 0,
                accelerator=canonical_accelerator(hint) if gpus and hint else None,
                per_worker=gpus if gpus and high > low else 0)
