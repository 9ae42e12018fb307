"""Step logs and failure tracebacks: where they live and how to read them.

Each attempt writes its stdout and stderr to its own file,
``HOME/logs/RUN/STEP.eEPOCH.log`` (attempt N of a step runs under epoch N; the
events say so). When an attempt fails, the controller stores the last lines
of its traceback in the run's events (kind ``failure``), so `segue status`
shows them from the store, wherever the worker ran.

Reading never creates anything, and every path is built from a checked run id
and a checked step name, so it stays inside the home.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import NotFoundError, UsageError
from ..home import Home, check_run_id
from ..states import Actor, RunState
from ..store.base import Event, Store

log = logging.getLogger("segue.logs")

TAIL_LINES = 12  # lines of a traceback kept in the store
_LINE_MAX = 400  # characters per kept line: a huge repr must not bloat the events table
# The flow's rule for step names; a fan-out's item or a loop's iteration is NAME.K.
_STEP = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}(\.[0-9]{1,9})?")
STOPPED = (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.PAUSED)


def check_step(step: str) -> str:
    """Step names become file names: only identifiers (no '..', '/', NUL, newline)."""
    if not isinstance(step, str) or not _STEP.fullmatch(step):
        raise UsageError(f"step name {step!r} is invalid; step names are Python identifiers "
                         "(letters, digits and '_'), or NAME.K for item K of a fan-out")
    return step


def _logs_dir(home: Home, run_id: str) -> Path:
    return home.root / "logs" / check_run_id(run_id)


def attempt_log_path(home: Home, run_id: str, step: str, epoch: int) -> Path:
    """Where the attempt of ``step`` under ``epoch`` writes its output (the directory is created)."""
    return home.logs_dir(run_id) / f"{check_step(step)}.e{int(epoch)}.log"


@dataclass(frozen=True)
class AttemptLog:
    step: str
    attempt: int
    epoch: int
    path: Path

    def header(self) -> str:
        if self.attempt == 0:
            return f"==> {self.step} earlier attempts (one file): {self.path} <=="
        return f"==> {self.step} attempt {self.attempt} (epoch {self.epoch}): {self.path} <=="


def _attempts(events: list[Event]) -> dict[str, list[tuple[int, int]]]:
    """(attempt, epoch) of every started attempt, per step, in order."""
    out: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        d = e.data or {}
        if e.kind == "task" and e.step and e.to_state == "RUNNING" and "epoch" in d:
            out.setdefault(e.step, []).append((int(d.get("attempt", d["epoch"])), int(d["epoch"])))
    return out


def attempt_logs(home: Home, store: Store, run_id: str, step: str | None = None,
                 attempt: int | None = None) -> list[AttemptLog]:
    """The logs of a run's attempts (of one step; one attempt), in the flow's step order."""
    store.get_run(run_id)  # an unknown run is an error
    steps = [t.step for t in store.get_tasks(run_id)]
    if step is not None:
        check_step(step)
        if step not in steps:
            raise NotFoundError(f"run {run_id!r} has no step {step!r}; its steps: {', '.join(steps)}")
        steps = [step]
    elif attempt is not None:
        raise UsageError("--attempt needs a STEP: segue logs RUN STEP --attempt N")
    started = _attempts(store.list_events(run_id, kinds=("task",)))
    d = _logs_dir(home, run_id)
    out = []
    for s in steps:
        legacy = d / f"{s}.log"  # before per-attempt logs, every attempt appended here
        if attempt is None and legacy.exists():
            out.append(AttemptLog(s, 0, 0, legacy))
        mine = started.get(s, [])
        if attempt is not None and attempt not in {a for a, _ in mine}:
            have = f"attempts 1..{len(mine)}" if mine else "no attempts yet"
            raise NotFoundError(f"step {s!r} of run {run_id!r} has {have}; there is no attempt {attempt}")
        for a, e in mine:
            if attempt is None or a == attempt:
                out.append(AttemptLog(s, a, e, d / f"{s}.e{e}.log"))
    return out


CHUNK = 1 << 20  # logs stream in pieces of this size: a huge log never sits in memory whole


def _chunks_from(path: Path, offset: int) -> Iterator[bytes]:
    """What ``path`` holds past ``offset``, in pieces (nothing if it is not written yet)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return  # the attempt is starting, or it ran elsewhere
    with f:
        f.seek(offset)
        while piece := f.read(CHUNK):
            yield piece


def stream_logs(logs: list[AttemptLog], *, headers: bool) -> Iterator[bytes]:
    """Every log in turn, each after its header line when ``headers``."""
    for lg in logs:
        if headers:
            yield f"{lg.header()}\n".encode()
        yield from _chunks_from(lg.path, 0)


def follow_chunks(home: Home, store: Store, run_id: str, step: str | None, *,
                  poll_s: float = 0.2) -> Generator[bytes, None, RunState]:
    """The logs, then what they gain, a header before each attempt's first bytes, until
    the run is finished or paused (or no live controller drives it any more); the
    generator returns the state the run stopped in."""
    offsets: dict[Path, int] = {}
    last: Path | None = None
    while True:
        run = store.get_run(run_id)
        done = run.state in STOPPED or (run.state != RunState.PENDING
                                        and not run.controller_alive(store.now()))
        # After the run stopped, one more pass: what the last attempt wrote before it ended.
        for lg in attempt_logs(home, store, run_id, step):
            for piece in _chunks_from(lg.path, offsets.get(lg.path, 0)):
                if lg.path != last:
                    yield f"{lg.header()}\n".encode()
                    last = lg.path
                offsets[lg.path] = offsets.get(lg.path, 0) + len(piece)
                yield piece
        if done:
            return run.state
        time.sleep(poll_s)


# -- failures -------------------------------------------------------------------

def traceback_tail(text: str, lines: int = TAIL_LINES) -> list[str]:
    kept = [ln.rstrip()[:_LINE_MAX] for ln in text.strip("\n").splitlines()]
    return kept[-lines:]


def record_failure(store: Store, home: Home, run_id: str, step: str, epoch: int, error: str,
                   attempt: int | None = None) -> None:
    """Store the end of a failed attempt's traceback (from its exit report) in the events.

    Best effort: it never raises, because the failure's own transition (retry or
    fail) must not wait on a diagnostic.
    """
    from ..executor.exits import exit_report_path

    tb = ""
    try:
        tb = str(json.loads(exit_report_path(home, run_id, step, epoch).read_text()).get(
            "traceback", ""))
    except (OSError, ValueError, AttributeError):
        pass  # killed by a signal, or the report is unreadable: the error line says what happened
    try:
        store.append_event(
            run_id, "failure", actor=Actor.FAILURE_DETECTOR, step=step,
            reason=f"attempt {attempt or epoch} (epoch {epoch}) failed: {error}",
            data={"epoch": epoch, "attempt": attempt or epoch, "error": error,
                  "traceback_tail": traceback_tail(tb) if tb else []},
        )
    except Exception as exc:  # a busy or full store: the transition that follows retries
        log.warning("run %s: could not record the traceback of %s epoch %d: %s",
                    run_id, step, epoch, exc)


def last_failures(events: list[Event]) -> dict[str, dict[str, Any]]:
    """The most recent failure of each step, as `segue status` shows it."""
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.kind == "failure" and e.step:
            d = e.data or {}
            out[e.step] = {"time": e.time, "attempt": d.get("attempt"), "epoch": d.get("epoch"),
                           "error": d.get("error"), "traceback_tail": d.get("traceback_tail", [])}
    return out
