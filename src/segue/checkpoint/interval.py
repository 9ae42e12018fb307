"""When to checkpoint: every N seconds, every N steps, or "auto" (Young/Daly).

``auto`` picks the interval that minimises expected lost time, the Young/Daly
optimum ``T = sqrt(2 * C * MTBF)``, where C is the measured cost of one
checkpoint (blocking plus background seconds, smoothed) and MTBF is configured or
observed (uptime / failures). It re-tunes when C moves by more than
``retune_ratio``, and every decision carries its inputs so the engine can record
it as an event. Pure apart from the injected clock: tests use a fake one.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_MTBF_S = 24 * 3600.0
"""Assumed when neither configured nor observed: a failure a day."""


@dataclass(frozen=True)
class IntervalDecision:
    mode: str  # "seconds" | "steps" | "auto"
    every_s: float | None
    every_steps: int | None
    cost_s: float | None
    mtbf_s: float | None
    mtbf_source: str  # "configured" | "observed" | "default" | ""
    reason: str

    def as_event(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items()}


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float | int) -> float:
    """``"30s"``, ``"5m"``, ``"1.5h"``, ``"250ms"`` or a number of seconds."""
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|min|m|h|d)?\s*", text)
        if not m:
            raise ValueError(
                f"interval {text!r} is not a duration; write it like '30s', '5m' or '1h'"
            )
        value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not value > 0:
        raise ValueError(f"interval must be > 0 seconds, not {text!r}")
    return value


class IntervalPolicy:
    """Decides whether a checkpoint is due; see the module docstring."""

    def __init__(
        self,
        every: str | float | None = None,
        every_steps: int | None = None,
        *,
        mtbf_s: float | None = None,
        initial_s: float = 60.0,
        min_s: float = 1.0,
        max_s: float = 6 * 3600.0,
        retune_ratio: float = 0.25,
        smoothing: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.auto = every == "auto"
        if not self.auto and every is None and every_steps is None:
            raise ValueError("give every='30s', every_steps=N or every='auto'")
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, not {every_steps}")
        self._every_s = None if every is None or self.auto else parse_duration(every)
        self._every_steps = every_steps
        self._mtbf_cfg = mtbf_s
        self._observed: tuple[float, int] | None = None
        self.initial_s, self.min_s, self.max_s = initial_s, min_s, max_s
        self.retune_ratio, self.smoothing = retune_ratio, smoothing
        self._clock = clock
        self._last_t = clock()
        # The step counter the last checkpoint covers. None: not known yet; the first
        # step :meth:`due` sees then sets it.
        self._last_step: int | None = None
        self._resumed = False  # mark(None) was called: the first step seen is covered
        self._forced = False
        self._cost: float | None = None  # smoothed
        self._cost_used: float | None = None  # the one the current decision used
        self.decision = self._decide("initial")

    # -- inputs ------------------------------------------------------------------
    def observe_failures(self, uptime_s: float, failures: int) -> IntervalDecision | None:
        """The run's history: total uptime and how many failures it had."""
        self._observed = (uptime_s, failures)
        return self._maybe_retune("mtbf observed", force=True)

    def mark(self, step: int | None = None) -> float:
        """A checkpoint is being taken now: restart the interval; returns the clock time.

        ``step`` is the counter the checkpoint covers; None when unknown (a restore
        in a flow): the first step :meth:`due` then sees counts as covered.
        """
        self._last_t = self._clock()
        self._last_step = step
        # A checkpoint taken (or restored) without a step counter covers the work done
        # so far, so the first step seen afterwards must not fire again.
        self._resumed = step is None
        self._forced = False
        return self._last_t

    def record(
        self, *, blocking_s: float, background_s: float, step: int | None = None,
        marked: bool = False,
    ) -> IntervalDecision | None:
        """A checkpoint's measured cost; returns a new decision if it re-tuned.

        Without ``marked`` (:meth:`mark` was not called when it was taken) the
        interval restarts now.
        """
        if not marked:
            self.mark(step)
        cost = blocking_s + background_s
        self._cost = cost if self._cost is None else (
            self.smoothing * cost + (1 - self.smoothing) * self._cost
        )
        return self._maybe_retune("cost changed")

    def force(self) -> None:
        """Make the next :meth:`due` true (a user's "checkpoint now")."""
        self._forced = True

    # -- the question --------------------------------------------------------------
    def due(self, step: int | None = None) -> bool:
        if self._forced:
            return True
        d = self.decision
        if d.every_steps is not None and step is not None:
            if self._last_step is None:
                # Fresh: the first step seen is not covered yet (a loop counting from 1
                # with every_steps=1 fires at 1). After a restore, it is.
                self._last_step = step if self._resumed else step - 1
            if step >= next_multiple(self._last_step, d.every_steps):
                return True
        return d.every_s is not None and self._clock() - self._last_t >= d.every_s

    # -- internals -----------------------------------------------------------------
    def _mtbf(self) -> tuple[float, str]:
        if self._mtbf_cfg is not None:
            return self._mtbf_cfg, "configured"
        if self._observed is not None and self._observed[1] > 0:
            return self._observed[0] / self._observed[1], "observed"
        return DEFAULT_MTBF_S, "default"

    def _maybe_retune(self, why: str, force: bool = False) -> IntervalDecision | None:
        if not self.auto or self._cost is None:
            return None
        used = self._cost_used
        if not force and used is not None and abs(self._cost - used) <= self.retune_ratio * used:
            return None
        self.decision = self._decide(why)
        return self.decision

    def _decide(self, why: str) -> IntervalDecision:
        if not self.auto:
            mode = "steps" if self._every_steps is not None and self._every_s is None else "seconds"
            return IntervalDecision(mode, self._every_s, self._every_steps, None, None, "",
                                    "configured")
        mtbf, source = self._mtbf()
        if self._cost is None:
            return IntervalDecision("auto", self.initial_s, None, None, mtbf, source,
                                    "no checkpoint cost measured yet; using the initial interval")
        self._cost_used = self._cost
        t = math.sqrt(2 * self._cost * mtbf)
        clamped = min(max(t, self.min_s), self.max_s)
        return IntervalDecision(
            "auto", clamped, None, self._cost, mtbf, source,
            f"{why}: young/daly sqrt(2 * {self._cost:.3g}s * {mtbf:.3g}s) = {t:.3g}s"
            + ("" if clamped == t else f", clamped to {clamped:.3g}s"),
        )


def next_multiple(covered: int, every: int) -> int:
    """The first positive multiple of ``every`` above ``covered``.

    ``every_steps=100`` means steps 100, 200, ... (like ``step % 100 == 0``), not
    "100 after whatever step was seen first": a counter that skips (batches of 32)
    fires at the first step at or past each multiple, and a checkpoint taken off
    the grid (a pause, "checkpoint now") does not shift the next one.
    """
    return max(covered // every + 1, 1) * every
