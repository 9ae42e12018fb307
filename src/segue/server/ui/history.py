"""A run's history read back from its events: attempts, the gaps between them, interruptions.

The store keeps no attempt table: an attempt is the span between a task's
``-> RUNNING`` event (which carries ``attempt`` and ``epoch``) and the next
event that moves the same task out of RUNNING. Everything here is derived
from the events and checkpoint rows the client returns; nothing is written.

What each gap and marker says comes from the events' actor and reason:
``paused by api:alice`` (the run's PAUSING event), ``preempted by run 'x'``
(the scheduler's reason), ``killed by SIGKILL`` (the failure event),
``backoff 0.2s`` (the RETRYING reason), ``controller lost`` (a task put back
to PENDING by the next controller).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...client.records import CheckpointRecord, Event
from ...run.restart import EVENT as RESTART_EVENT

_SIGNAL = re.compile(r"killed by (SIG[A-Z0-9]+)")
_BACKOFF = re.compile(r"retry (\d+) of (\d+) in ([0-9.]+)s")
_PREEMPTED_BY = re.compile(r"preempted by run '([^']+)'")


@dataclass
class Attempt:
    step: str
    attempt: int
    epoch: int
    start: float
    end: float | None = None  # None: still running
    outcome: str = "RUNNING"  # the task state it ended in
    reason: str = ""  # of the event that ended it
    actor: str = ""
    devices: list[int] = field(default_factory=list)
    restored: int | None = None  # seq of the checkpoint it restored, when known
    restored_how: str = ""  # "event": a warning named it; "inferred": newest one before the start
    error: str | None = None  # from the failure event, if it failed
    # Lost with its controller: it ended, unseen, at its last heartbeat (the "accounting"
    # event of its reclaim), not when the next controller reclaimed it.
    last_alive: float | None = None


@dataclass(frozen=True)
class Gap:
    """Time a step spent between two attempts (or after its last one), and why."""

    step: str
    start: float
    end: float | None  # None: still waiting
    kind: str  # pause | preempt | crash | failure | lost | deadline | code | other
    cause: str


@dataclass(frozen=True)
class Interruption:
    """A marker on the run's timeline."""

    time: float
    kind: str  # pause | preempt | crash | failure | lost | deadline | code | disk | cancel | failed | resume
    label: str
    actor: str
    step: str | None = None


@dataclass
class History:
    attempts: list[Attempt]
    gaps: list[Gap]
    interruptions: list[Interruption]

    def of(self, step: str) -> list[Attempt]:
        return [a for a in self.attempts if a.step == step]


def signal_of(error: str | None) -> str | None:
    m = _SIGNAL.search(error or "")
    return m.group(1) if m else None


def read_history(events: Sequence[Event], checkpoints: Iterable[CheckpointRecord]) -> History:
    attempts: list[Attempt] = []
    open_: dict[str, Attempt] = {}
    failures: dict[tuple[str, int], str] = {}
    marks: list[Interruption] = []
    lost_marks: dict[tuple[str, int], int] = {}  # (step, epoch) -> index of its "lost" mark
    seen: dict[tuple[str, int], float] = {}  # (step, epoch) -> its newest event (a sign of life)
    for e in events:
        d = e.data or {}
        if e.step and isinstance(d.get("epoch"), int) and e.kind in ("checkpoint", "warning", "scale"):
            seen[(e.step, d["epoch"])] = e.time
        if e.kind == "task" and e.step:
            if e.to_state == "RUNNING" and "epoch" in d:
                a = Attempt(step=e.step, attempt=int(d.get("attempt", d["epoch"])), epoch=int(d["epoch"]),
                            start=e.time, devices=[int(x) for x in d.get("devices", []) or []])
                open_[e.step] = a
                attempts.append(a)
            elif e.from_state == "RUNNING" and e.step in open_:
                a = open_.pop(e.step)
                a.end, a.outcome, a.reason, a.actor = e.time, e.to_state or "?", e.reason, e.actor
                a.error = failures.get((e.step, a.epoch))
                mark = _task_mark(e, a)
                if mark is not None:
                    if mark.kind == "lost":
                        lost_marks[(a.step, a.epoch)] = len(marks)
                    marks.append(mark)
        elif e.kind == "accounting" and e.step and isinstance(d.get("end"), int | float):
            mine = [a for a in attempts if a.step == e.step and a.epoch == d.get("epoch")]
            if mine and mine[-1].outcome == "PENDING":
                _ended_unseen(mine[-1], float(d["end"]), marks, lost_marks)
        elif e.kind == "failure" and e.step:
            failures[(e.step, int(d.get("epoch", 0)))] = str(d.get("error", e.reason))
        elif e.kind == "warning" and e.step and d.get("used_seq") is not None and e.step in open_:
            open_[e.step].restored, open_[e.step].restored_how = int(d["used_seq"]), "event"
        elif e.kind == RESTART_EVENT and e.step:
            marks.append(Interruption(e.time, "code", f"step {e.step} restarted from scratch", e.actor, e.step))
        elif e.kind in ("run", "command"):
            mark = _run_mark(e)
            if mark is not None:
                marks.append(mark)
    for a in attempts:
        if a.outcome == "PENDING" and a.last_alive is None:
            # Reclaimed before its reclaim was accounted: its newest event is the
            # last sign of life we know of (a lower bound of when it ended).
            _ended_unseen(a, seen.get((a.step, a.epoch), a.start), marks, lost_marks)
    _infer_restores(attempts, list(checkpoints), events)
    return History(attempts=attempts, gaps=_gaps(attempts, events), interruptions=marks)


def _ended_unseen(a: Attempt, at: float, marks: list[Interruption],
                  lost_marks: dict[tuple[str, int], int]) -> None:
    """An attempt lost with its controller ended at ``at``, its last sign of life."""
    a.last_alive = at = max(a.start, min(at, a.end if a.end is not None else at))
    a.end = at
    i = lost_marks.get((a.step, a.epoch))
    if i is not None:
        m = marks[i]
        marks[i] = Interruption(at, m.kind, m.label, m.actor, m.step)


def _run_mark(e: Event) -> Interruption | None:
    to = e.to_state
    if to in ("PAUSING", "PAUSED") and e.from_state not in ("PAUSING",):
        m = _PREEMPTED_BY.search(e.reason)
        if m:
            return Interruption(e.time, "preempt", f"preempted by run {m.group(1)}", e.actor)
        if "disk" in e.reason:
            return Interruption(e.time, "disk", e.reason, e.actor)
        return Interruption(e.time, "pause", f"paused by {e.actor}", e.actor)
    if e.kind == "command" and (e.data or {}).get("command") == "resume":
        return Interruption(e.time, "resume", f"resumed by {e.actor}", e.actor)  # who asked
    if to == "RUNNING" and e.from_state in ("PAUSED", "PAUSING", "FAILED") and e.actor != "controller":
        # A controller's own transition follows a "resume requested" command (marked
        # above); another actor (the scheduler after a preemption) resumed by itself.
        return Interruption(e.time, "resume", f"resumed by {e.actor}", e.actor)
    if to == "FAILED":
        return Interruption(e.time, "failed", e.reason, e.actor)
    if to == "CANCELLED":
        return Interruption(e.time, "cancel", f"cancelled by {e.actor}", e.actor)
    return None


def _task_mark(e: Event, a: Attempt) -> Interruption | None:
    """The marker for an attempt that ended other than by success or a pause."""
    if e.to_state in ("RETRYING", "FAILED"):
        sig = signal_of(a.error or e.reason)
        if sig:
            return Interruption(e.time, "crash", f"{a.step} attempt {a.attempt} killed by {sig}", e.actor, a.step)
        return Interruption(e.time, "failure", f"{a.step} attempt {a.attempt} failed: {a.error or e.reason}",
                            e.actor, a.step)
    if e.to_state == "PENDING":
        return Interruption(e.time, "lost", f"{a.step} attempt {a.attempt} lost with its controller",
                            e.actor, a.step)
    if e.to_state == "PARKED" and "deadline" in e.reason:
        return Interruption(e.time, "deadline", f"{a.step} attempt {a.attempt} killed at the pause deadline",
                            e.actor, a.step)
    if e.to_state == "PARKED" and "disk" in e.reason:
        return Interruption(e.time, "disk", e.reason, e.actor, a.step)
    return None


def _pause_cause_at(events: Sequence[Event], t: float) -> tuple[str, str]:
    """(kind, text) of the latest run pause at or before ``t``."""
    kind, text = "pause", "paused"
    for e in events:
        if e.time > t:
            break
        if e.kind == "run" and e.to_state in ("PAUSING", "PAUSED") and e.from_state != "PAUSING":
            m = _PREEMPTED_BY.search(e.reason)
            kind, text = ("preempt", f"preempted by run {m.group(1)}") if m else ("pause", f"paused by {e.actor}")
    return kind, text


def _resumed_between(events: Sequence[Event], t0: float, t1: float | None) -> str | None:
    for e in events:
        if e.time <= t0:
            continue
        if t1 is not None and e.time > t1:
            break
        if e.kind == "command" and (e.data or {}).get("command") == "resume":
            return e.actor  # the principal who asked, not the controller that obeyed
        if e.kind == "run" and e.to_state == "RUNNING" and e.from_state in ("PAUSED", "PAUSING", "FAILED"):
            return e.actor
    return None


def _cause(a: Attempt, nxt: Attempt | None, events: Sequence[Event]) -> tuple[str, str]:
    if a.outcome == "PARKED":
        if "deadline" in a.reason:
            kind, text = "deadline", "killed at the pause deadline"
        elif "disk" in a.reason:
            kind, text = "other", a.reason
        else:
            kind, text = _pause_cause_at(events, a.end or a.start)
    elif a.outcome == "RETRYING":
        sig = signal_of(a.error or a.reason)
        kind, text = ("crash", f"killed by {sig}") if sig else ("failure", f"failed: {a.error or a.reason}")
        m = _BACKOFF.search(a.reason)
        if m:
            text += f"; backoff {float(m.group(3)):g}s (retry {m.group(1)} of {m.group(2)})"
    elif a.outcome == "PENDING":
        kind, text = "lost", "controller lost; the attempt was reclaimed"
    elif a.outcome == "FAILED":
        kind, text = "failure", f"failed, retries exhausted: {a.error or a.reason}"
    else:
        kind, text = "other", a.reason or a.outcome.lower()
    who = _resumed_between(events, a.end or a.start, nxt.start if nxt else None)
    if who:
        text += f"; resumed by {who}"
    elif nxt is None:
        text += "; waiting"
    return kind, text


def _gaps(attempts: list[Attempt], events: Sequence[Event]) -> list[Gap]:
    by_step: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_step.setdefault(a.step, []).append(a)
    out = []
    for step, mine in by_step.items():
        for i, a in enumerate(mine):
            if a.end is None or a.outcome in ("SUCCEEDED", "CANCELLED"):
                continue
            nxt = mine[i + 1] if i + 1 < len(mine) else None
            if nxt is None and a.outcome == "FAILED":
                continue  # the run's FAILED marker says it; no open gap
            kind, cause = _cause(a, nxt, events)
            out.append(Gap(step, a.end, nxt.start if nxt else None, kind, cause))
    return out


def _infer_restores(attempts: list[Attempt], cks: list[CheckpointRecord], events: Sequence[Event]) -> None:
    """An attempt restores the newest checkpoint of its step committed before it started
    (unless it was quarantined, or a restart discarded it); a warning event overrides."""
    floors: dict[str, list[tuple[float, int]]] = {}
    for e in events:
        if e.kind == RESTART_EVENT and e.step:
            floors.setdefault(e.step, []).append((e.time, int(e.data.get("discarded_through_seq", 0))))
    by_step: dict[str, list[CheckpointRecord]] = {}
    for c in cks:
        by_step.setdefault(c.step, []).append(c)
    for a in attempts:
        if a.restored_how:
            continue
        floor = max((s for t, s in floors.get(a.step, []) if t <= a.start), default=0)
        before = [c for c in by_step.get(a.step, []) if c.created_at < a.start and c.epoch < a.epoch
                  and c.seq > floor and c.status != "quarantined"]
        if before:
            a.restored, a.restored_how = max(c.seq for c in before), "inferred"


# -- progress series ------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    time: float
    done: float
    total: float | None
    failures: float | None
    records: float | None


def _num(d: Any, key: str) -> float | None:
    v = d.get(key) if isinstance(d, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def series(events: Iterable[Event], step: str, *, max_points: int = 300) -> list[Point]:
    """What the step reported as its progress (``ctx.progress``: done of total) over time,
    as recorded with each checkpoint commit. A position is not progress (a batch index
    restarts every epoch): only a data step's, which says ``done``, stands in for runs
    recorded before commits carried the progress."""
    commits = [e for e in events if e.kind == "checkpoint" and e.step == step and e.to_state is None
               and isinstance(e.data, dict) and "position" in e.data]
    reported = any(isinstance(e.data.get("progress"), dict) for e in commits)
    pts = []
    for e in commits:
        pos = e.data["position"]
        got = e.data.get("progress") if reported else pos
        done = _num(got, "done")
        if done is not None:
            pts.append(Point(e.time, done, _num(got, "total"), _num(pos, "failures"), _num(pos, "records_in")))
    if len(pts) > max_points:  # keep the shape and the newest point
        k = -(-len(pts) // max_points)
        pts = pts[::k] + ([pts[-1]] if (len(pts) - 1) % k else [])
    return pts


@dataclass(frozen=True)
class Rate:
    time: float  # the end of the interval
    throughput: float  # units per second
    backlog: float | None
    error_rate: float | None  # failed records per record read, in the interval


def rates(points: Sequence[Point], total: float | None) -> list[Rate]:
    out = []
    for p, q in zip(points, points[1:], strict=False):
        dt = q.time - p.time
        if dt <= 0:
            continue
        tot = q.total if q.total is not None else total
        err = None
        if q.failures is not None and p.failures is not None and q.records and p.records is not None:
            dr = q.records - p.records
            err = max(0.0, q.failures - p.failures) / dr if dr > 0 else 0.0
        out.append(Rate(q.time, max(0.0, q.done - p.done) / dt,
                        None if tot is None else max(0.0, tot - q.done), err))
    return out
