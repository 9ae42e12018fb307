"""`segue ckpt ... RUN`: the checkpoint commands applied to a run of this home,
and `segue ckpt now RUN`, which asks the run's workers to checkpoint at once."""

from __future__ import annotations

import argparse
import copy
import os
import signal
import socket
from typing import Any

from ..errors import UnknownRunError, UsageError
from ..home import Home
from . import ckpt


def add_parser(sub: Any) -> None:
    p = ckpt.add_parser(sub)
    # `ckpt` already has its sub-parsers; add `now` beside them.
    inner = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    now = inner.add_parser("now", help="ask every running task of RUN to checkpoint at its next pause point")
    now.add_argument("run")


def _run_dirs(home: Home, run_id: str) -> list[str] | None:
    """The checkpoint directories of a run's steps, or None if ``run_id`` is no run here."""
    if not home.exists() or os.path.exists(run_id) or "://" in run_id:
        return None
    try:
        tasks = home.open_store().get_tasks(run_id)
    except UnknownRunError:
        return None
    dirs = [home.data_dir / "runs" / run_id / t.step / "ckpt" for t in tasks]
    return [str(d) for d in dirs if d.is_dir()]


def cmd_ckpt(a: argparse.Namespace, home: Home) -> int:
    if a.ckpt_cmd == "now":
        return _now(a.run, home)
    dirs = _run_dirs(home, a.path)
    if dirs is None:
        return ckpt.cmd_ckpt(a)
    if a.ckpt_cmd == "prune":
        raise UsageError("a run's checkpoints are pruned by its steps' keep_checkpoints; "
                         "pass a directory to prune by hand")
    code = 0
    for d in dirs:
        sub = copy.copy(a)
        sub.path = d
        code = max(code, ckpt.cmd_ckpt(sub))
    return code


def _now(run_id: str, home: Home) -> int:
    store = home.open_store()
    here = socket.gethostname()
    asked = []
    for t in store.get_tasks(run_id):
        if t.state.value == "RUNNING" and t.pid and (t.host or here) == here:
            try:
                os.kill(t.pid, signal.SIGUSR2)
                asked.append(t.step)
            except ProcessLookupError:
                pass
    if not asked:
        raise UsageError(f"run {run_id!r} has no running task on this host to checkpoint")
    print(f"asked {', '.join(asked)} to checkpoint now")
    return 0
