"""What the pool page shows: this host's devices, their holders, a device timeline, the queue.

The pool database keeps only who holds each device now; the timeline is read
back from the attempt events (which name their devices) of this home's recent
runs, so other homes' past use of a device is not on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...client.base import RESTING
from ...client.local import LocalClient
from ...client.records import PoolView, QueueEntry
from ...errors import SegueError
from .charts import TimeAxis, Timeline, hms
from .history import Attempt, read_history


@dataclass
class PoolPage:
    pool: PoolView | None
    pool_error: str | None
    queue: list[QueueEntry]
    timeline: Timeline | None
    timeline_runs: int
    now: float
    home: str  # this home's key in the pool (holders of other homes are not linked)


TIMELINE_RUNS = 40
TIMELINE_WINDOW_S = 24 * 3600.0


def _device_timeline(client: LocalClient, pool: PoolView | None, now: float) -> tuple[Timeline | None, int]:
    """Who held which device, from the attempt events of this home's recent runs
    (the pool keeps only current holders; other homes' history is theirs)."""
    recent = [r for r in client.runs(limit=TIMELINE_RUNS * 5)
              if now - r.updated_at < TIMELINE_WINDOW_S or r.state not in RESTING][:TIMELINE_RUNS]
    spans: list[tuple[int, Attempt, str]] = []
    for r in recent:
        for a in read_history(list(client.events(r.run_id)), []).attempts:
            for d in a.devices:
                spans.append((d, a, r.run_id))
    if not spans:
        return None, len(recent)
    axis = TimeAxis.over([t for _, a, _ in spans for t in (a.start, a.end or now)])
    tl = Timeline(axis)
    indexes = sorted({d for d, _, _ in spans} | {d.index for d in (pool.devices if pool else [])})
    rows = {i: tl.row(f"gpu {i}") for i in indexes}
    for d, a, run in spans:
        end = a.end or now
        tl.box(rows[d], a.start, end, f"st-{a.outcome}",
               f"gpu {d}: run {run} step {a.step} attempt {a.attempt}, {hms(a.start)} to "
               f"{hms(end) if a.end else 'now'} ({end - a.start:.1f}s), {a.outcome}", run)
    return tl, len(recent)


def pool_page(client: LocalClient) -> PoolPage:
    now = time.time()
    pool, error = None, None
    try:
        pool = client.pool()
    except SegueError as exc:
        error = str(exc)
    try:
        queue = client.queue()
    except SegueError as exc:
        queue, error = [], error or str(exc)
    timeline, n = _device_timeline(client, pool, now)
    return PoolPage(pool, error, queue, timeline, n, now, str(client.home.root))
