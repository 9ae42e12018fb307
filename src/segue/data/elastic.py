"""The devices of a parallel map step's sub-workers, and how many of them it may have.

A map step with sub-workers gives each its own group of devices (``gpus`` per
sub-worker; ``CUDA_VISIBLE_DEVICES`` is set in the sub-worker before anything
imports a framework). An elastic step (``workers=(min, max)``) also changes
size while it runs; :class:`Scaler` is the coordinator's handle on its
allocation in the host pool:

* ``revoked()``: devices promised to a more urgent run (a partial preemption
  its controller accepted); the coordinator stops the sub-workers on them at a
  checkpoint barrier, then ``shrink()`` gives them back;
* ``grow()``: another sub-worker's devices when the pool has them free and no
  other run waits for devices (growth is opportunistic).

The step's process learns where its pool is and which devices it was placed on
(in the allocation's order) from its controller's record, which the run's worker
hands the step's context as a :class:`Placement` (``ctx.placement``); this layer
reads no environment. On Ray the groups are the
pool's count of the cluster's GPUs: each sub-worker's actor asks Ray for its
GPUs, and stopping it (a partial preemption) is what frees one in Ray. Without a pool (a direct
``run_map`` call) a CPU step grows up to ``max`` with its backlog, and a step
never shrinks below ``min``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("segue.data")

POLL_S = 0.25  # how often the allocation is read for devices promised away
GROW_BACKOFF_S = 1.0  # after the pool said no, wait this long before asking again

Group = tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Where an attempt's allocation is in the host pool: what the run's worker hands
    the step's context (``ctx.placement``) from its controller's record."""

    # The allocation's devices in the pool; on Ray they are the cluster's GPUs as the pool
    # counts them (Ray picks the physical ones; its sub-workers hold the GPUs).
    devices: tuple[int, ...] = ()
    home: str | None = None  # how the pool names the run's home
    host: str | None = None  # the pool host the attempt was placed on
    # The host pool's handle, opened when first needed (an elastic step's), and how it
    # is named in messages. This layer never opens a pool itself.
    open_pool: Callable[[], Any] | None = None
    pool_name: str = ""


class Scaler:
    """Device groups of one attempt's sub-workers (see the module docstring)."""

    def __init__(self, ctx: Any, low: int, high: int, *, devices: tuple[int, ...] | None = None,
                 pool: Any = None, home: str | None = None, host: str | None = None) -> None:
        self.ctx, self.low, self.high = ctx, low, high
        devs = devices or ()
        self.per_worker = len(devs) // low if devs and len(devs) % low == 0 else 0
        if devs and not self.per_worker:
            # Devices that do not divide among the sub-workers: all of them see all.
            log.warning("step %s: %d devices for %d sub-workers; every sub-worker sees all of them",
                        getattr(ctx, "step", "?"), len(devs), low)
        self._initial = devs
        self.pool, self.home, self.host = pool, home, host
        self._next_poll = 0.0
        self._next_grow = 0.0

    @classmethod
    def for_attempt(cls, ctx: Any, low: int, high: int) -> Scaler:
        """The scaler of the attempt ``ctx`` runs, by the placement its worker handed it
        (a bare context without one: no devices, no pool)."""
        placed: Placement = getattr(ctx, "placement", None) or Placement()
        pool = None
        home = placed.home
        if high > low and placed.open_pool is not None and home:
            try:
                pool = placed.open_pool()
            except Exception as exc:  # noqa: BLE001 - without the pool the step keeps its size
                log.warning("step %s cannot open the host pool %s (%s); it keeps %d sub-workers",
                            getattr(ctx, "step", "?"), placed.pool_name, exc, low)
        return cls(ctx, low, high, devices=placed.devices, pool=pool, home=home, host=placed.host)

    @property
    def elastic(self) -> bool:
        return self.high > self.low

    def initial_groups(self) -> list[Group | None]:
        """One entry per sub-worker to start: its devices, or None to inherit the step's."""
        if not self.per_worker:
            return [None] * self.low
        g = self.per_worker
        return [self._initial[k:k + g] for k in range(0, len(self._initial), g)]

    def _key(self) -> tuple[str, str, str, int]:
        c = self.ctx
        return (str(self.home), c.run_id, c.step, c.epoch)

    def revoked(self) -> set[int]:
        """Devices promised to a preemptor (read at most every POLL_S)."""
        if self.pool is None or not self.per_worker:
            return set()
        now = time.monotonic()
        if now < self._next_poll:
            return set()
        self._next_poll = now + POLL_S
        a = self.pool.allocation(*self._key())
        return set(a.revoke) if a is not None else set()

    def grow(self) -> Group | None:
        """Devices for one more sub-worker: () for a CPU step; None if there are none now."""
        if not self.per_worker:
            return () if not self._initial else None  # a CPU step grows with its backlog
        if self.pool is None:
            return None
        now = time.monotonic()
        if now < self._next_grow:
            return None
        got = self.pool.grow(*self._key(), gpus=self.per_worker, max_gpus=self.high * self.per_worker)
        if not got:
            self._next_grow = now + GROW_BACKOFF_S
            return None
        return tuple(got)

    def shrink(self, devices: list[int]) -> None:
        if self.pool is not None and devices:
            self.pool.shrink(*self._key(), devices)
