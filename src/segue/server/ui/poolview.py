"""What the pool page shows: this host's devices, their holders, a device timeline, the queue,
and the last changes of the pool's configuration (who set it, and to what).

The pool database keeps only who holds each device now; the timeline is read
back from the attempt events (which name their devices) of this home's recent
runs, so other homes' past use of a device is not on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...client.base import RESTING
from ...client.local import LocalClient
from ...client.records import PoolChange, PoolView, QueueEntry
from ...errors import SegueError
from .charts import TimeAxis, Timeline, hms
from .history import Attempt, read_history


@dataclass(frozen=True)
class ChangeRow:
    """One configuration change of the pool, as the page lists it."""

    time: float
    actor: str
    user: str
    what: str


@dataclass
class PoolPage:
    pool: PoolView | None
    pool_error: str | None
    queue: list[QueueEntry]
    timeline: Timeline | None
    timeline_runs: int
    now: float
    home: str  # this home's key in the pool (holders of other homes are not linked)
    changes: list[ChangeRow]


TIMELINE_RUNS = 40
TIMELINE_WINDOW_S = 24 * 3600.0
CHANGES_SHOWN = 10


def _gib(n: Any) -> str:
    return f"{float(n) / 2**30:.1f} GiB"


def _gpu_memory(sizes: Any) -> str:
    return " / ".join(_gib(m) for m in sizes or []) or "—"


# (key of hostpool.pool_summary, label, format): the order the page names what changed.
_FIELDS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("gpus", "gpus", str), ("gpu_memory", "gpu memory", _gpu_memory), ("virtual", "virtual gpus", str),
    ("cpus", "cpus", lambda x: f"{float(x):g}"), ("memory", "memory", _gib), ("source", "source", str),
)


def _config(s: dict[str, Any]) -> str:
    gpus = int(s.get("gpus", 0))
    of = f" of {_gpu_memory(s.get('gpu_memory'))}" if gpus else ""
    return (f"{gpus} gpu{'' if gpus == 1 else 's'}{of} ({s.get('source', '?')}), "
            f"{float(s.get('cpus', 0)):g} cpus, {_gib(s.get('memory', 0))} memory")


def describe_change(change: dict[str, Any]) -> str:
    """``gpus 2 → 3; cpus 8 → 4``; a host's first configuration is stated in full."""
    before, after = change.get("before"), change.get("after") or {}
    if before is None:
        return f"set to {_config(after)}"
    all_virtual = all(s.get("virtual") == s.get("gpus") for s in (before, after))
    diffs = [f"{label} {fmt(before.get(key))} → {fmt(after.get(key))}"
             for key, label, fmt in _FIELDS if before.get(key) != after.get(key)
             and not (key == "virtual" and all_virtual)]  # then "gpus" says it
    return "; ".join(diffs) if diffs else f"unchanged: {_config(after)}"


def _change_row(c: PoolChange) -> ChangeRow:
    return ChangeRow(c.time, c.actor, c.user, describe_change(c.change))


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
    try:
        changes = [_change_row(c) for c in client.pool_changes(limit=CHANGES_SHOWN)]
    except SegueError as exc:
        changes, error = [], error or str(exc)
    timeline, n = _device_timeline(client, pool, now)
    return PoolPage(pool, error, queue, timeline, n, now, client.pool_home, changes)
