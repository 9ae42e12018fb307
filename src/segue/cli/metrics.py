"""`segue metrics RUN`: what the run's steps logged with ``ctx.log_metrics``.

One table per step: a row per index (the step's own counter), a column per
metric. ``--json`` prints the points themselves (``Client.metrics``).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..client.base import BaseClient
from ..client.records import MetricPoint
from .render import print_json


def add_parser(sub: Any) -> None:
    m = sub.add_parser("metrics", help="the metrics a run's steps logged (ctx.log_metrics)")
    m.add_argument("run", help="the run's id")
    m.add_argument("--step", default=None, metavar="STEP", help="only this step's metrics")
    m.add_argument("--json", action="store_true", help="the points as JSON, one object each")


def _fmt(v: float | None) -> str:
    return "nan" if v is None else f"{v:.6g}"


def table(points: list[MetricPoint]) -> list[str]:
    """The lines of the human form: per step, the index and one column per metric."""
    lines: list[str] = []
    steps: dict[str, dict[int, dict[str, float | None]]] = {}
    names: dict[str, list[str]] = {}
    for p in points:
        steps.setdefault(p.step, {}).setdefault(p.index, {})[p.name] = p.value
        if p.name not in names.setdefault(p.step, []):
            names[p.step].append(p.name)
    for step, rows in steps.items():
        cols = names[step]
        cells = [["step", *cols]] + [[str(i), *(_fmt(r[c]) if c in r else "-" for c in cols)]
                                     for i, r in sorted(rows.items())]
        widths = [max(len(row[k]) for row in cells) for k in range(len(cols) + 1)]
        if lines:
            lines.append("")
        lines.append(f"{step}:")
        lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                  for row in cells]
    return lines


def cmd_metrics(a: argparse.Namespace, client: BaseClient) -> int:
    points = client.metrics(a.run, a.step)
    if a.json:
        print_json([dataclasses.asdict(p) for p in points])
        return 0
    if not points:
        print(f"run {a.run} has no metrics" + (f" of step {a.step}" if a.step else "")
              + "; steps log them with ctx.log_metrics(step=i, loss=...)")
        return 0
    for line in table(points):
        print(line)
    return 0
