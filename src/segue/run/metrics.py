"""``ctx.log_metrics``: the points a step logs, buffered in the attempt's process until
the next flush, and the TensorBoard event files written beside the store when
``tensorboard`` is installed.

A point is (name, index, value), the index being the step's own counter. The step
thread only checks its arguments and adds to a dict under a short lock; the flushes
(every heartbeat, every checkpoint commit, the attempt's end) each take the whole
buffer in one fenced store write. A failed write puts its points back (a point
logged again meanwhile keeps its newer value), so a busy store loses nothing.
NaN and infinities are stored as None: training loops log NaN losses, and a chart
draws a gap there rather than refusing the step.
"""

from __future__ import annotations

import logging
import math
import operator
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("segue.step")

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_INDEX = 2**63 - 1  # the stores keep the index as a signed 64-bit integer

Point = tuple[str, int, float | None]  # (name, index, value); None: NaN or an infinity


def check_points(step: Any, values: Mapping[str, Any]) -> list[Point]:
    """The points of one ``log_metrics`` call; ValueError (one line) for a bad argument."""
    try:
        index = operator.index(step)  # ints, NumPy and 0-d integer tensors; never a float
    except TypeError:
        raise ValueError(f"log_metrics: step must be an integer (the step's own counter), "
                         f"not {type(step).__name__}") from None
    if not 0 <= index <= MAX_INDEX:
        raise ValueError(f"log_metrics: step must be from 0 to {MAX_INDEX}, not {index}")
    if not values:
        raise ValueError("log_metrics: give at least one value, e.g. log_metrics(step=i, loss=loss)")
    out: list[Point] = []
    for name, v in values.items():
        if not NAME.match(name):
            raise ValueError(f"log_metrics: metric name {name[:80]!r} must be a letter or '_' "
                             "then up to 63 letters, digits or '_'")
        if isinstance(v, str | bytes):
            raise ValueError(f"log_metrics: metric {name!r} must be a number, not {type(v).__name__}")
        try:
            x = float(v)
        except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor of many values
            raise ValueError(f"log_metrics: metric {name!r} must be a number, not "
                             f"{type(v).__name__}") from exc
        out.append((name, index, x if math.isfinite(x) else None))
    return out


class MetricsBuffer:
    """The points logged since the last flush; shared by the step thread and the flushers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _pending: held for a dict update only
        self._flush_lock = threading.Lock()  # one flush at a time, in logging order
        self._pending: dict[tuple[str, int], float | None] = {}
        # Called with each batch once the store holds it (TensorBoard); never raise.
        self.exporters: list[Callable[[Sequence[Point]], None]] = []

    def add(self, points: Sequence[Point]) -> None:
        with self._lock:
            for name, index, value in points:
                # Moved to the end: the batch's order stays the logging order, so the
                # last point of a name in a batch is the newest (the flow's latest value).
                self._pending.pop((name, index), None)
                self._pending[(name, index)] = value

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self, write: Callable[[list[Point]], Any]) -> int:
        """Hand every buffered point to ``write`` in one call; returns how many. A
        failed write keeps them due (and raises)."""
        with self._flush_lock:
            with self._lock:
                taken, self._pending = self._pending, {}
            if not taken:
                return 0
            points = [(name, index, value) for (name, index), value in taken.items()]
            try:
                write(points)
            except BaseException:
                with self._lock:
                    newer, self._pending = self._pending, taken
                    for key, value in newer.items():
                        self._pending.pop(key, None)
                        self._pending[key] = value
                raise
            for export in self.exporters:
                export(points)
            return len(points)

    def close(self) -> None:
        for export in self.exporters:
            closer = getattr(export, "close", None)
            if closer is not None:
                closer()


class TensorBoardExport:
    """Writes each flushed batch as scalars to a TensorBoard event file in ``logdir``, if
    ``tensorboard`` can be imported (nothing, and no warning, if not).

    Each attempt writes its own file and begins it with a restart at its first point's
    index (what torch's ``SummaryWriter(purge_step=...)`` writes): TensorBoard then drops
    what earlier files hold from that index on, so a step redone after a resume is drawn
    once, as the store keeps it once. A write that fails turns the export off with one
    warning; the store has the points either way.
    """

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self._writer: Any = None
        self._protos: Any = None
        self._off = False

    def __call__(self, points: Sequence[Point]) -> None:
        if self._off or not points:
            return
        try:
            if self._writer is None and not self._open(min(i for _, i, _ in points)):
                return
            event, summary = self._protos[0], self._protos[2]
            t = time.time()
            for name, index, value in points:
                self._writer.add_event(event(step=index, wall_time=t, summary=summary(value=[
                    summary.Value(tag=name, simple_value=math.nan if value is None else value)])))
            self._writer.flush()
        except Exception as exc:  # noqa: BLE001 - an optional export must never fail the step
            self._off = True
            log.warning("metrics: cannot write TensorBoard event files in %s (%s); they are in "
                        "the store (segue metrics)", self.logdir, exc)

    def _open(self, first: int) -> bool:
        try:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:  # not installed: the export is optional (pip install 'segue[tensorboard]')
            self._off = True
            return False
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._protos = (Event, SessionLog, Summary)
        self._writer = EventFileWriter(str(self.logdir))
        self._writer.add_event(Event(step=first, wall_time=time.time(),
                                     session_log=SessionLog(status=SessionLog.START)))
        return True

    def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("metrics: closing the TensorBoard event file failed: %s", exc)
            self._writer = None
