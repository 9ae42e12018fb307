"""The run page's metric charts: each metric a step logged (``ctx.log_metrics``) over
the step's own counter, with a dashed line where an attempt resumed.

A resume point is where an attempt's points begin: the store keeps one point per
index, the newest attempt's, so the smallest index a later attempt wrote is where
it took over (the step it restored, or 0 if it started over). A point logged as
NaN is a gap in the line. Only numbers and strings come out of here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...client.records import MetricPoint
from .charts import Marker
from .history import Attempt

X0, PLOT_W, HEIGHT = 56.0, 300.0, 110.0
TOP, BOTTOM = 14.0, HEIGHT - 16
MAX_POINTS = 400  # per metric: a long run's points are thinned to this many for the chart
MAX_CHARTS = 24  # per step


@dataclass(frozen=True)
class MetricChart:
    name: str
    segments: list[str]  # SVG polylines; a NaN point ends one
    ymin: str
    ymax: str
    last: str
    ticks: list[tuple[float, str]]  # (x, index)
    markers: list[Marker]
    points: int  # how many points the metric has (before thinning)
    width: float = X0 + PLOT_W + 30
    height: float = HEIGHT
    x0: float = X0
    x1: float = X0 + PLOT_W
    bottom: float = BOTTOM


@dataclass(frozen=True)
class StepMetrics:
    step: str
    charts: list[MetricChart]


def _num(v: float) -> str:
    return f"{v:.4g}"


def _thin(points: list[MetricPoint]) -> list[MetricPoint]:
    if len(points) <= MAX_POINTS:
        return points
    stride = -(-len(points) // MAX_POINTS)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def resume_points(points: Sequence[MetricPoint], attempts: Sequence[Attempt]) -> list[tuple[int, str]]:
    """(index, title) where each attempt after the step's first took over."""
    first: dict[int, int] = {}
    for p in points:
        first[p.epoch] = min(p.index, first.get(p.epoch, p.index))
    by_epoch = {a.epoch: a for a in attempts}
    out = []
    for epoch in sorted(first)[1:]:
        a = by_epoch.get(epoch)
        who = f"attempt {a.attempt}" if a else f"the attempt of epoch {epoch}"
        out.append((first[epoch], f"{who} resumed at step {first[epoch]}"))
    return out


def _chart(name: str, pts: list[MetricPoint], lo: int, hi: int,
           marks: list[tuple[int, str]]) -> MetricChart | None:
    values = [p.value for p in pts if p.value is not None]
    if len(values) < 2:
        return None
    span = max(hi - lo, 1)
    vmin, vmax = min(values), max(values)
    vspan = (vmax - vmin) or 1.0

    def x(i: int) -> float:
        return round(X0 + (i - lo) / span * PLOT_W, 1)

    segments: list[str] = []
    cur: list[str] = []
    for p in _thin(pts):
        if p.value is None:
            if len(cur) > 1:
                segments.append(" ".join(cur))
            cur = []
            continue
        cur.append(f"{x(p.index)},{round(BOTTOM - (p.value - vmin) / vspan * (BOTTOM - TOP), 1)}")
    if len(cur) > 1:
        segments.append(" ".join(cur))
    ticks = [(x(lo + round(span * k / 3)), str(lo + round(span * k / 3))) for k in range(4)]
    last = pts[-1].value
    return MetricChart(name, segments, _num(vmin), _num(vmax), "nan" if last is None else _num(last),
                       ticks, [Marker(x(i), "mk-resume", t) for i, t in marks], len(pts))


def step_metrics(points: Sequence[MetricPoint], attempts: Sequence[Attempt]) -> list[StepMetrics]:
    """A chart per metric of each step, sharing the step's index axis and resume points."""
    by_step: dict[str, dict[str, list[MetricPoint]]] = {}
    for p in points:  # the store's order: step, then name, then index
        by_step.setdefault(p.step, {}).setdefault(p.name, []).append(p)
    out = []
    for step, metrics in by_step.items():
        mine = [p for ps in metrics.values() for p in ps]
        lo, hi = min(p.index for p in mine), max(p.index for p in mine)
        marks = resume_points(mine, [a for a in attempts if a.step == step])
        charts = [c for name, ps in list(metrics.items())[:MAX_CHARTS]
                  if (c := _chart(name, ps, lo, hi, marks)) is not None]
        if charts:
            out.append(StepMetrics(step, charts))
    return out
