"""Geometry of the inline SVG charts: a time axis, Gantt rows, line charts.

Only numbers and strings come out of here; the templates draw them, so every
label passes through Jinja's autoescaping. No chart library, no script.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

LABEL_W = 150.0  # room for the row labels left of the plot
PLOT_W = 760.0
ROW_H = 22.0
TOP = 18.0  # room for the tick labels


def hms(t: float) -> str:
    """A time of day to the millisecond, for tooltips."""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def clock(t: float, span: float) -> str:
    fmt = "%H:%M:%S" if span < 86400 * 2 else "%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(t))


@dataclass(frozen=True)
class TimeAxis:
    t0: float
    t1: float
    x0: float = LABEL_W
    width: float = PLOT_W

    @classmethod
    def over(cls, times: Iterable[float], *, x0: float = LABEL_W, width: float = PLOT_W) -> TimeAxis:
        ts = [t for t in times if t is not None]
        lo, hi = (min(ts), max(ts)) if ts else (0.0, 1.0)
        return cls(lo, hi if hi > lo else lo + 1.0, x0, width)

    def x(self, t: float) -> float:
        return round(self.x0 + (min(max(t, self.t0), self.t1) - self.t0) / (self.t1 - self.t0) * self.width, 1)

    def ticks(self, n: int = 6) -> list[tuple[float, str]]:
        span = self.t1 - self.t0
        return [(self.x(self.t0 + span * i / (n - 1)), clock(self.t0 + span * i / (n - 1), span))
                for i in range(n)]


@dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float
    cls: str  # a CSS class: the state or the gap's kind
    title: str  # the tooltip: everything the box stands for
    label: str = ""  # drawn inside when it fits

    @property
    def fits(self) -> bool:
        return self.w > 6.5 * len(self.label) + 6


@dataclass(frozen=True)
class Marker:
    x: float
    cls: str
    title: str


@dataclass
class Timeline:
    """Rows of boxes over one time axis (the Gantt, the checkpoint and device timelines)."""

    axis: TimeAxis
    rows: list[tuple[float, str]] = field(default_factory=list)  # (y of the row's middle, label)
    boxes: list[Box] = field(default_factory=list)
    dots: list[Box] = field(default_factory=list)  # boxes drawn as circles (checkpoints)
    markers: list[Marker] = field(default_factory=list)

    @property
    def height(self) -> float:
        return TOP + max(len(self.rows), 1) * ROW_H + 4

    @property
    def width(self) -> float:
        return self.axis.x0 + self.axis.width + 30  # room for the last tick's label

    @property
    def ticks(self) -> list[tuple[float, str]]:
        return self.axis.ticks()

    def row(self, label: str) -> float:
        """Add a row; returns the y of its top."""
        y = TOP + len(self.rows) * ROW_H
        self.rows.append((y + ROW_H / 2, label))
        return y

    def box(self, y: float, t0: float, t1: float, cls: str, title: str, label: str = "", *,
            inset: float = 3.0, short: str = "") -> None:
        """``short``: the label drawn instead when ``label`` does not fit (the title keeps it all)."""
        x0, x1 = self.axis.x(t0), self.axis.x(t1)
        b = Box(x0, y + inset, max(x1 - x0, 1.5), ROW_H - 2 * inset, cls, title, label)
        self.boxes.append(b if b.fits or not short else dataclasses.replace(b, label=short))

    def dot(self, y: float, t: float, cls: str, title: str) -> None:
        self.dots.append(Box(self.axis.x(t), y + ROW_H / 2, 4, 4, cls, title))

    def mark(self, t: float, cls: str, title: str) -> None:
        self.markers.append(Marker(self.axis.x(t), cls, title))


@dataclass(frozen=True)
class LineChart:
    title: str
    unit: str
    axis: TimeAxis
    height: float
    points: str  # the SVG polyline
    ymax: float
    last: float
    markers: list[Marker]

    @property
    def width(self) -> float:
        return self.axis.x0 + self.axis.width + 30

    @property
    def ticks(self) -> list[tuple[float, str]]:
        return self.axis.ticks(4)

    @property
    def bottom(self) -> float:
        return self.height - 16


def line_chart(title: str, unit: str, samples: Sequence[tuple[float, float]], axis: TimeAxis,
               marks: Iterable[tuple[float, str, str]] = (), height: float = 110.0) -> LineChart | None:
    """A polyline of (time, value) samples, with vertical markers (time, class, title)."""
    if len(samples) < 2:
        return None
    ymax = max(v for _, v in samples) or 1.0
    top, bottom = 8.0, height - 16
    pts = " ".join(f"{axis.x(t)},{round(bottom - v / ymax * (bottom - top), 1)}" for t, v in samples)
    return LineChart(title, unit, axis, height, pts, ymax, samples[-1][1],
                     [Marker(axis.x(t), c, s) for t, c, s in marks if axis.t0 <= t <= axis.t1])
