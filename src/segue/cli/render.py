"""Terminal rendering: a live rich table on a TTY, event lines elsewhere."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from ..store.base import Event, RunRecord, Store, TaskRecord
from ..units import format_bytes

if TYPE_CHECKING:  # rich is imported only to draw on a terminal: a command's start-up stays short
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table


def fmt_time(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, as disks and transfer rates count: segue.units)."""
    return format_bytes(n)


def _count(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}"


def progress_text(done: float | None, total: float | None, unit: str | None = None) -> str:
    """'2.1 MB / 7.7 MB (28%)', '2,164,232 / 7,748,446 records (28%)' or '150 / 300 (50%)'.

    ``unit`` is what a data step counts (its checkpoint position says bytes or
    records); a plain step's ``ctx.progress`` has no unit, so none is shown.
    """
    if done is None:
        return "-"
    if unit == "bytes":
        text = human_bytes(done) if total is None else f"{human_bytes(done)} / {human_bytes(total)}"
    else:
        text = _count(done) if total is None else f"{_count(done)} / {_count(total)}"
        if unit:
            text += f" {unit}"
    if total:
        text += f" ({min(100.0, 100.0 * done / total):.0f}%)"
    return text


def event_line(e: Event) -> str:
    who = f"{e.step}: " if e.step else ""
    move = f"{e.from_state or ''} -> {e.to_state} ".lstrip() if e.to_state else ""
    return f"{fmt_time(e.time)} [{e.actor}] {who}{e.kind} {move}({e.reason})"


def position_detail(position: Any) -> str:
    """What a step's last checkpoint says about it, in a few words."""
    if not isinstance(position, dict):
        return ""
    if "rate_rps" in position:  # a data step
        eta = position.get("eta_s")
        parts = [f"{position.get('records_in', 0):,} rec", f"{position['rate_rps']:,.0f}/s"]
        if eta is not None:
            parts.append(f"eta {eta:.0f}s")
        if position.get("failures"):
            parts.append(f"{position['failures']} failed")
        if position.get("records_retried"):
            parts.append(f"{position['records_retried']:,} retried")
        if position.get("workers"):
            parts.append(f"{position['workers']} workers, {position.get('splits', 0)} splits")
        return ", ".join(parts)
    return ", ".join(f"{k} {v}" for k, v in list(position.items())[:3])


def latest_positions(store: Store, run_id: str) -> dict[str, str]:
    out: dict[str, tuple[int, str]] = {}
    for c in store.list_checkpoints(run_id):
        if c.step not in out or c.seq > out[c.step][0]:
            out[c.step] = (c.seq, f"#{c.seq} " + position_detail(c.position))
    return {k: v for k, (_, v) in out.items()}


def latest_units(store: Store, run_id: str) -> dict[str, str]:
    """What each data step's progress counts (bytes or records), from its last checkpoint."""
    out: dict[str, tuple[int, str]] = {}
    for c in store.list_checkpoints(run_id):
        unit = c.position.get("unit") if isinstance(c.position, dict) else None
        if isinstance(unit, str) and (c.step not in out or c.seq > out[c.step][0]):
            out[c.step] = (c.seq, unit)
    return {k: v for k, (_, v) in out.items()}


def task_table(run: RunRecord, tasks: list[TaskRecord], details: dict[str, str] | None = None,
               units: dict[str, str] | None = None) -> Table:
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    table = Table(title=f"run {run.run_id}  [bold]{run.state.value}[/bold]", expand=False)
    for col in ("step", "state", "progress", "done/total", "attempts", "pid", "last checkpoint"):
        table.add_column(col)
    for t in tasks:
        done, total = t.progress_done, t.progress_total
        unit = (units or {}).get(t.step)
        if total:
            bar: Any = ProgressBar(total=total, completed=min(done or 0, total), width=24)
            frac = progress_text(done or 0, total, unit)
        else:
            bar, frac = "", progress_text(done, None, unit)
        table.add_row(t.step, t.state.value, bar, frac, str(t.attempts),
                      str(t.pid) if t.pid else "-", (details or {}).get(t.step, "-"))
    return table


def shown_live(e: Event) -> bool:
    """Whether the live display prints ``e``: retention's "pruned" line per checkpoint
    is noise there (`segue events` still lists it), as are the environment's routine records
    (at submit, and a step's imports); a resume's list of what changed is shown."""
    return not (e.kind == "checkpoint" and e.to_state == "pruned") and not (
        e.kind == "environment" and (e.step is not None or e.data.get("at") == "submit"))


class RunDisplay:
    """Called on every controller tick; throttled so drawing stays cheap.

    ``after``: the id of the last event not to print (a resumed run's history)."""

    def __init__(self, store: Store, run_id: str, console: Console | None = None, *,
                 after: int = 0) -> None:
        self.store = store
        self.run_id = run_id
        self.console = console
        self.live: Live | None = None
        self.last_event = after
        self.last_draw = 0.0

    def __enter__(self) -> RunDisplay:
        if self.console is None and sys.stdout.isatty():
            from rich.console import Console

            self.console = Console(stderr=False)
        if self.console is not None and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(console=self.console, refresh_per_second=8, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush_events()
        if self.live is not None:
            # The last frame shows where the run ended, not the last throttled tick.
            self.live.update(task_table(self.store.get_run(self.run_id), self.store.get_tasks(self.run_id),
                                        latest_positions(self.store, self.run_id),
                                        latest_units(self.store, self.run_id)))
            self.live.__exit__(None, None, None)

    def flush_events(self) -> None:
        for e in self.store.list_events(self.run_id, after_id=self.last_event):
            self.last_event = e.id
            if not shown_live(e):
                continue
            if self.live is not None:
                self.live.console.print(event_line(e), markup=False, highlight=False)
            else:
                print(event_line(e), flush=True)

    def __call__(self, run: RunRecord, tasks: list[TaskRecord]) -> None:
        now = time.monotonic()
        if now - self.last_draw < 0.12:
            return
        self.last_draw = now
        self.flush_events()
        if self.live is not None:
            self.live.update(task_table(run, tasks, latest_positions(self.store, self.run_id),
                                        latest_units(self.store, self.run_id)))


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))
