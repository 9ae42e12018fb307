"""Plans from measurements: a line fitted to a ``segue bench-model`` profile.

``peak = base + slope * batch`` by least squares over the measured batch sizes
replaces the planner's formula for that model on that device type: what the
device really allocates (framework workspace, allocator rounding) is in the
measurements and in no formula.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .profiles import check_profile

LIMIT = 1 << 40  # the largest batch or context the searches (here and in plan) report


def _positive(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise UsageError(f"{name} must be an integer >= 1, not {v!r}")
    return v


@dataclass(frozen=True)
class Fit:
    """``peak_bytes = base_bytes + slope_bytes_per_item * batch``, fitted to a profile."""

    base_bytes: float
    slope_bytes_per_item: float
    points: int = 0

    def peak_bytes(self, batch: int) -> int:
        return math.ceil(self.base_bytes + self.slope_bytes_per_item * batch)

    def max_batch(self, capacity_bytes: int, slack: float = 0.10) -> int:
        """The largest batch whose predicted peak stays within ``(1 - slack) * capacity``."""
        if not 0.0 <= slack < 1.0:
            raise UsageError(f"slack must be a fraction from 0 to 1, not {slack!r}")
        usable = capacity_bytes * (1 - slack)
        if self.slope_bytes_per_item <= 0:
            raise UsageError("the profile's peak memory does not grow with the batch, so it bounds "
                             "no batch size; measure larger batches with `segue bench-model`")
        if self.base_bytes + self.slope_bytes_per_item > usable:
            return 0
        n = int((usable - self.base_bytes) // self.slope_bytes_per_item)
        while n > 0 and self.peak_bytes(n) > usable:  # rounding up in peak_bytes
            n -= 1
        return min(n, LIMIT)


def fit_profile(profile: Mapping[str, Any]) -> Fit:
    """Least squares of ``peak_bytes`` on ``batch_size`` over the profile's batches.

    With a single batch size (one point, or repeats of it) the line goes through
    ``memory_after_load_bytes`` at batch 0 and the mean peak at that size. A
    negative slope (noise between near-equal peaks) is clamped to 0 with the
    base at the highest peak, so the fit never promises memory it has not seen.
    """
    p = check_profile(profile)  # the format's one definition (bench-model writes it)
    pts = [(float(b["batch_size"]), float(b["peak_bytes"])) for b in p["batches"]]
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        base = p.get("memory_after_load_bytes")
        if isinstance(base, bool) or not isinstance(base, int | float) or not base >= 0:
            raise UsageError("profile has one batch size and no memory_after_load_bytes; measure "
                             "two batch sizes or more with `segue bench-model`")
        slope = (my - base) / mx
    else:
        slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
        base = my - slope * mx
    if slope < 0:
        return Fit(max(y for _, y in pts), 0.0, n)
    return Fit(float(base), slope, n)


def plan_from_profile(profile: Mapping[str, Any], capacity_bytes: int, slack: float = 0.10) -> int:
    """The largest batch a measured profile predicts to fit in ``(1 - slack) * capacity_bytes``."""
    return fit_profile(profile).max_batch(capacity_bytes, slack)


@dataclass(frozen=True)
class ProfilePlan:
    """``segue plan --profile``: the fit, the largest batch, and the prediction at ``batch``."""

    fit: Fit
    capacity_bytes: int
    slack: float
    max_batch: int
    batch: int
    predicted_peak_bytes: int
    fits: bool
    items_per_s: float | None  # measured at the batch size nearest ``batch``
    measured_batch: int | None
    cost_per_1k_items: float | None
    largest_measured: int = 0  # a batch above it is extrapolated from the fit
    method: str = "profile"

    @property
    def extrapolated(self) -> bool:
        return max(self.batch, self.max_batch) > self.largest_measured

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "base_bytes": self.fit.base_bytes,
                "slope_bytes_per_item": self.fit.slope_bytes_per_item, "points": self.fit.points,
                "capacity_bytes": self.capacity_bytes, "slack": self.slack,
                "usable_bytes": math.floor(self.capacity_bytes * (1 - self.slack)),
                "max_batch": self.max_batch, "batch": self.batch,
                "predicted_peak_bytes": self.predicted_peak_bytes, "fits": self.fits,
                "items_per_s": self.items_per_s, "measured_batch": self.measured_batch,
                "cost_per_1k_items": self.cost_per_1k_items,
                "largest_measured_batch": self.largest_measured, "extrapolated": self.extrapolated}


def plan_profile(profile: Mapping[str, Any], capacity_bytes: int, *, batch: int | None = None,
                 slack: float = 0.10, price_per_hour: float | None = None) -> ProfilePlan:
    """Plan from measurements; ``batch`` defaults to the profile's recommended batch, else the largest."""
    fit = fit_profile(profile)
    top = fit.max_batch(capacity_bytes, slack)
    b = _positive("batch", batch if batch is not None
                  else profile.get("recommended_batch_size") or max(top, 1))
    near = min(profile["batches"], key=lambda m: (abs(m["batch_size"] - b), -m["batch_size"]))
    ips = near.get("items_per_s")
    ips = float(ips) if isinstance(ips, int | float) and not isinstance(ips, bool) and ips > 0 else None
    cost = None if ips is None or price_per_hour is None else price_per_hour / 3600 / ips * 1000
    peak = fit.peak_bytes(b)
    return ProfilePlan(fit, capacity_bytes, slack, top, b, peak,
                       peak <= capacity_bytes * (1 - slack), ips, int(near["batch_size"]), cost,
                       max(int(m["batch_size"]) for m in profile["batches"]))
