"""What the run page shows, shaped from the client's records.

Each function takes a client acting as the viewer and returns plain data for
a template; nothing here writes, and every file read (a log tail) resolves
inside the home first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...client.base import RESTING
from ...client.local import LocalClient
from ...client.records import CheckpointRecord, Event, RunStatus
from ...errors import SegueError
from ...flow.model import task_step
from ...home import check_run_id
from ...placement.policy import priority_class, priority_name
from ..app import home_file
from ..auth import Principal
from . import dag
from .charts import ROW_H, LineChart, TimeAxis, Timeline, hms, line_chart
from .history import Attempt, History, Interruption, rates, read_history, series
from .metricsview import StepMetrics, step_metrics

FINISHED = ("SUCCEEDED", "CANCELLED")
EVENT_FILTERS = ("important", "all", "failures")
EVENTS_SHOWN = 200
CHECKPOINTS_SHOWN = 60
LOG_TAIL_BYTES = 64 * 1024
OUTPUT_CHARS = 8000
MAX_GANTT_ROWS = 40


def is_failure(e: Event) -> bool:
    return (e.kind in ("failure", "warning", "fenced") or e.to_state in ("FAILED", "RETRYING", "quarantined")
            or "killed" in e.reason)


def is_noise(e: Event) -> bool:
    """Routine checkpoint bookkeeping, hidden from the default event list."""
    return ((e.kind == "checkpoint" and e.to_state != "quarantined") or e.kind == "checkpoint-interval"
            or (e.kind == "environment" and e.step is not None))  # a step's imports (run.environment)


def filter_events(events: Sequence[Event], which: str) -> list[Event]:
    if which == "failures":
        return [e for e in events if is_failure(e)]
    if which == "important":
        return [e for e in events if not is_noise(e)]
    return list(events)


@dataclass
class Buttons:
    """Which steering buttons the viewer may use, and which the run's state allows now."""

    pause: bool
    resume: bool
    cancel: bool
    state: str

    @property
    def any(self) -> bool:
        return self.pause or self.resume or self.cancel

    def shown(self, action: str) -> bool:
        if action == "pause":
            return self.state in ("PENDING", "RUNNING")
        if action == "resume":
            return self.state in ("PAUSED", "FAILED", "PAUSING")
        return self.state not in FINISHED


def buttons(p: Principal, priority: int, state: str) -> Buttons:
    cls = priority_class(priority)
    may_pause = p.may("pause", cls)  # cancel is allowed with pause, as in the API
    return Buttons(pause=may_pause, resume=p.may("resume", cls), cancel=may_pause, state=state)


@dataclass
class StepRow:
    name: str
    state: str
    group: str | None  # the folded group it belongs to, if any
    done: float | None
    total: float | None
    unit: str | None
    attempts: int
    failures: int
    last_checkpoint: dict[str, Any] | None
    error: str | None
    waiting_for: str | None
    data: dict[str, Any]  # a data step's position: shard, records, failures, rate, eta
    write_cost_s: float | None  # measured checkpoint cost (from the interval tuner's events)
    shards: str | None = None  # a data step's shards, split-aware: "9/9 shards done (8 + 1 split)"
    earlier_errors: list[dict[str, Any]] = field(default_factory=list)  # history, not the step's error

    @property
    def fraction(self) -> float | None:
        if self.state == "SUCCEEDED":
            return 1.0
        if self.total and self.done is not None:
            return min(1.0, max(0.0, self.done / self.total))
        return None


@dataclass
class CheckpointRow:
    step: str
    seq: int
    epoch: int
    time: float
    nbytes: int
    position: str
    status: str
    restored_by: list[int]  # attempts that restored it


@dataclass
class Charts:
    step: str
    charts: list[LineChart]


@dataclass
class Selected:
    step: str | None
    attempt: int | None
    attempts: list[Attempt]
    log: str | None  # the tail of the attempt's log
    log_note: str
    output: str | None
    output_note: str


@dataclass
class RunPage:
    status: RunStatus
    priority_name: str
    priority_class: str
    params_json: str
    buttons: Buttons
    graph: dag.Graph
    steps: list[StepRow]
    groups: dict[str, list[StepRow]]
    gantt: Timeline
    gaps: list[tuple[str, str, float, float | None]]  # (step, cause, start, end), newest first
    interruptions: list[Interruption]
    checkpoints: Timeline
    checkpoint_rows: list[CheckpointRow]
    checkpoints_total: int
    charts: list[Charts]
    events: list[Event]
    events_total: int
    events_filter: str
    selected: Selected
    expand: list[str]
    now: float
    follow: bool  # the page keeps refreshing
    poll_ms: int
    metrics: list[StepMetrics] = field(default_factory=list)  # ctx.log_metrics, over each step's counter


def _step_rows(st: RunStatus, graph: dag.Graph, events: Sequence[Event]) -> list[StepRow]:
    member = {s: g for g, ms in graph.groups.items() for s in ms}
    costs: dict[str, float] = {}
    for e in events:
        if e.kind == "checkpoint-interval" and e.step and isinstance(e.data.get("cost_s"), int | float):
            costs[e.step] = float(e.data["cost_s"])
    rows = []
    for s in st.steps:
        pos = (s.last_checkpoint or {}).get("position")
        data = {k: pos[k] for k in ("shard_index", "shards", "records_in", "records_out", "failures",
                                    "rate_rps", "eta_s") if isinstance(pos, dict) and k in pos}
        rows.append(StepRow(s.name, s.state, member.get(s.name), s.progress.get("done"), s.progress.get("total"),
                            s.progress.get("unit"), s.attempts, s.failures, s.last_checkpoint, s.error,
                            s.waiting_for, data, costs.get(s.name), shards_text(pos), s.earlier_errors))
    return rows


def shards_text(pos: Any) -> str | None:
    """Where a data step is among its shards. A parallel step's position counts the
    pieces splits made ("shards" is the input's count) and the ones queued and running."""
    if not isinstance(pos, dict) or not isinstance(pos.get("shards"), int):
        return None
    n = pos["shards"]
    if isinstance(pos.get("slots"), list):
        splits = pos.get("splits") if isinstance(pos.get("splits"), int) else 0
        running = sum(1 for x in pos["slots"] if isinstance(x, dict) and x.get("shard") is not None)
        queued = pos.get("queued") if isinstance(pos.get("queued"), int) else 0
        total = n + splits  # each split turns one unfinished piece into two
        text = f"{max(0, total - queued - running)}/{total} shards done"
        if splits:
            text += f" ({n} + {splits} split)"
        return text + (f", {running} running" if running else "")
    i = pos.get("shard_index")
    if not isinstance(i, int):
        return f"{n} shards"
    return f"shard {i + 1}/{n}" if i < n else f"{n}/{n} shards done"


def _gantt(hist: History, steps: list[StepRow], axis: TimeAxis, now: float,
           stopped: dict[str, float] | None = None) -> Timeline:
    """``stopped``: step -> last heartbeat of a running attempt that nothing drives any
    more (its controller is gone): it ended there, unseen, not now."""
    stopped = stopped or {}
    tl = Timeline(axis)
    rows: dict[str, float] = {}
    for s in steps:
        key = s.group or s.name
        if key not in rows:
            if len(rows) >= MAX_GANTT_ROWS:
                continue
            rows[key] = tl.row(key)
        rows[s.name] = rows[key]
    for a in hist.attempts:
        if a.step not in rows:
            continue
        dead = a.end is None and a.step in stopped
        end = a.end if a.end is not None else max(a.start, stopped[a.step]) if dead else now
        restored = f"; restored checkpoint {a.restored} ({a.restored_how})" if a.restored else ""
        devs = f" on devices {a.devices}" if a.devices else ""
        seen = " (its last heartbeat)" if dead or a.last_alive is not None else ""
        title = (f"{a.step} attempt {a.attempt} (epoch {a.epoch}){devs}: {hms(a.start)} to "
                 f"{hms(end) if a.end or dead else 'now'}{seen} ({end - a.start:.1f}s), {a.outcome}"
                 f"{': ' + a.reason if a.reason and a.outcome != 'SUCCEEDED' else ''}{restored}")
        tl.box(rows[a.step], a.start, end, "st-PENDING" if dead else f"st-{a.outcome}", title, f"#{a.attempt}")
    for g in hist.gaps:
        if g.step not in rows:
            continue
        end = g.end if g.end is not None else now
        tl.box(rows[g.step], g.start, end, f"gap gap-{g.kind}", f"{g.step}: {g.cause} ({end - g.start:.1f}s)",
               g.cause, inset=ROW_H / 2 - 2, short=g.cause.split(";")[0])  # "preempted by run hi"
    for m in hist.interruptions:
        tl.mark(m.time, f"mk-{m.kind}", f"{hms(m.time)} {m.label}")
    return tl


def _checkpoint_timeline(cks: list[CheckpointRecord], hist: History, steps: list[StepRow],
                         axis: TimeAxis) -> Timeline:
    tl = Timeline(axis)
    rows: dict[str, float] = {}
    for s in steps:
        if any(c.step == s.name for c in cks) and len(rows) < MAX_GANTT_ROWS:
            rows[s.name] = tl.row(s.name)
    restored: dict[tuple[str, int], list[int]] = {}
    for a in hist.attempts:
        if a.restored is not None:
            restored.setdefault((a.step, a.restored), []).append(a.attempt)
    for c in cks:
        if c.step in rows:
            by = restored.get((c.step, c.seq))
            tl.dot(rows[c.step], c.created_at, f"ck-{c.status}" + (" ck-restored" if by else ""),
                   f"{c.step} checkpoint {c.seq} (epoch {c.epoch}) at {hms(c.created_at)}: {c.nbytes} bytes, "
                   f"{c.status}, position {_short(c.position)}" + (f"; restored by attempt {', '.join(map(str, by))}" if by else ""))
    for a in hist.attempts:
        if a.attempt > 1 and a.step in rows:
            tl.mark(a.start, "mk-resume", f"{a.step} attempt {a.attempt} started at {hms(a.start)}"
                    + (f", restoring checkpoint {a.restored} ({a.restored_how})" if a.restored else ", from scratch"))
    return tl


def _charts(events: Sequence[Event], st: RunStatus, hist: History, axis: TimeAxis) -> list[Charts]:
    out = []
    small = TimeAxis(axis.t0, axis.t1, 46.0, 300.0)
    marks = [(a.start, "mk-resume", f"attempt {a.attempt} of {a.step} resumed") for a in hist.attempts
             if a.attempt > 1] + [(m.time, f"mk-{m.kind}", m.label) for m in hist.interruptions
                                  if m.kind != "resume"]
    for s in st.steps:
        pts = series(events, s.name)
        if len(pts) < 2:
            continue
        unit = s.progress.get("unit") or "units"
        total = s.progress.get("total")
        rs = rates(pts, float(total) if isinstance(total, int | float) else None)
        charts = [line_chart("progress", unit, [(p.time, p.done) for p in pts], small, marks),
                  line_chart("throughput", f"{unit}/s", [(r.time, r.throughput) for r in rs], small, marks)]
        if any(r.backlog is not None for r in rs):
            charts.append(line_chart("backlog", unit, [(r.time, r.backlog or 0.0) for r in rs], small, marks))
        if any(r.error_rate is not None for r in rs):
            charts.append(line_chart("error rate", "failed/record",
                                     [(r.time, r.error_rate or 0.0) for r in rs], small, marks))
        got = [c for c in charts if c is not None]
        if got:
            out.append(Charts(s.name, got))
    return out


def _log_tail(client: LocalClient, run_id: str, a: Attempt) -> tuple[str | None, str]:
    """The end of the attempt's log, read from inside the home only."""
    rel = f"logs/{check_run_id(run_id)}/{a.step}.e{int(a.epoch)}.log"
    try:
        path = home_file(client.home, rel)
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read()
    except FileNotFoundError:
        return None, f"no log file for attempt {a.attempt} (it ran on another machine, or before logs were kept)"
    except (OSError, SegueError) as exc:
        return None, f"the log cannot be read: {exc}"
    cut = size > LOG_TAIL_BYTES
    text = data.decode("utf-8", errors="replace")
    if cut:
        text = text.split("\n", 1)[-1]
    return text, (f"last {LOG_TAIL_BYTES // 1024} KiB of {size} bytes" if cut else f"{size} bytes")


def _output(client: LocalClient, run_id: str, step: str) -> tuple[str | None, str]:
    try:
        text = json.dumps(client.output(run_id, step), indent=1, default=str, sort_keys=True)
    except SegueError as exc:
        return None, str(exc)
    if len(text) > OUTPUT_CHARS:
        return text[:OUTPUT_CHARS], (f"first {OUTPUT_CHARS} of {len(text)} characters; the whole value: "
                                     f"GET /api/runs/{run_id}/steps/{step}/output")
    return text, ""


def _is_task(client: LocalClient, st: RunStatus, name: str | None, names: list[str]) -> bool:
    """Whether ``name`` is a task of a fan-out or a loop of this run (``NAME.K``)."""
    if name is None or task_step(name)[0] not in names or task_step(name)[1] is None:
        return False
    try:
        client.store.get_task(st.run_id, name)
    except SegueError:
        return False
    return True


def _state_of(client: LocalClient, st: RunStatus, name: str) -> str:
    """A step's state, or a fan-out's or a loop's task's (folded into its step: the store's)."""
    if task_step(name)[1] is None:
        return st.step(name).state
    return client.store.get_task(st.run_id, name).state.value


def _selected(client: LocalClient, st: RunStatus, hist: History, step: str | None,
              attempt: int | None) -> Selected:
    names = [s.name for s in st.steps]
    if step not in names and not _is_task(client, st, step, names):
        running = [s.name for s in st.steps if s.state == "RUNNING"]
        tried = [a.step for a in hist.attempts]
        step = running[0] if running else (tried[-1] if tried else (names[0] if names else None))
    if step is None:
        return Selected(None, None, [], None, "", None, "")
    mine = hist.of(step)
    chosen = next((a for a in mine if a.attempt == attempt), mine[-1] if mine else None)
    log, note = _log_tail(client, st.run_id, chosen) if chosen else (None, "no attempt yet")
    out, out_note = (None, "")
    if _state_of(client, st, step) == "SUCCEEDED":
        out, out_note = _output(client, st.run_id, step)
    return Selected(step, chosen.attempt if chosen else None, mine, log, note, out, out_note)


def run_page(client: LocalClient, p: Principal, run_id: str, *, step: str | None = None,
             attempt: int | None = None, events_filter: str = "important",
             expand: Sequence[str] = ()) -> RunPage:
    st = client.status(run_id)
    events = list(client.events(run_id))
    cks = client.checkpoints(run_id)
    hist = read_history(events, cks)
    now = time.time()
    live = st.state not in RESTING
    t_end = max([now if live else st.updated_at, *(e.time for e in events[-1:])])
    axis = TimeAxis.over([st.created_at, t_end])
    fp = client.store.get_run(run_id).fingerprint
    edges = dag.flow_edges(st.flow_path, fp.get("file") if isinstance(fp, dict) else None,
                           [s.name for s in st.steps])
    graph = dag.build([(s.name, s.state) for s in st.steps], edges, frozenset(expand))
    dag.mark_interruptions(graph, [(g.step, g.kind, g.cause, g.start) for g in hist.gaps])
    steps = _step_rows(st, graph, events)
    groups: dict[str, list[StepRow]] = {}
    for r in steps:
        if r.group:
            groups.setdefault(r.group, []).append(r)
    which = events_filter if events_filter in EVENT_FILTERS else "important"
    shown = filter_events(events, which)
    ck_sorted = sorted(cks, key=lambda c: (c.created_at, c.seq), reverse=True)
    restored: dict[tuple[str, int], list[int]] = {}
    for a in hist.attempts:
        if a.restored is not None:
            restored.setdefault((a.step, a.restored), []).append(a.attempt)
    ck_rows = [CheckpointRow(c.step, c.seq, c.epoch, c.created_at, c.nbytes, _short(c.position), c.status,
                             restored.get((c.step, c.seq), []))
               for c in ck_sorted[:CHECKPOINTS_SHOWN]]
    # Every quarantined one is listed, however old: it is what an operator looks for.
    ck_rows += [CheckpointRow(c.step, c.seq, c.epoch, c.created_at, c.nbytes, _short(c.position), c.status,
                              restored.get((c.step, c.seq), []))
                for c in ck_sorted[CHECKPOINTS_SHOWN:] if c.status == "quarantined"]
    gaps = [(g.step, g.cause, g.start, g.end) for g in reversed(hist.gaps)]
    state = st.state.value
    # Nothing drives the run (its controller died, or waits for the store and stopped its
    # attempts): a running attempt is drawn to its last heartbeat, as accounting charges it.
    undriven = live and not st.controller.get("alive")
    stopped = {s.name: s.last_heartbeat for s in st.steps
               if undriven and s.state == "RUNNING" and s.last_heartbeat is not None}
    return RunPage(
        status=st, priority_name=priority_name(st.priority), priority_class=priority_class(st.priority),
        params_json=json.dumps(st.params, indent=1, sort_keys=True, default=str),
        buttons=buttons(p, st.priority, state), graph=graph, steps=steps, groups=groups,
        gantt=_gantt(hist, steps, axis, now, stopped), gaps=gaps, interruptions=hist.interruptions,
        checkpoints=_checkpoint_timeline(cks, hist, steps, axis), checkpoint_rows=ck_rows,
        checkpoints_total=len(cks), charts=_charts(events, st, hist, axis),
        events=list(reversed(shown[-EVENTS_SHOWN:])), events_total=len(shown), events_filter=which,
        selected=_selected(client, st, hist, step, attempt), expand=sorted(expand), now=now,
        follow=state not in FINISHED, poll_ms=1000 if live else 4000,
        metrics=step_metrics(client.metrics(run_id), hist.attempts),
    )


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
