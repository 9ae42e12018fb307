"""`segue logs RUN [STEP] [--attempt N] [--follow]`: the output of a run's attempts."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import SegueError, UsageError
from ..home import Home
from ..run.logs import attempt_logs, follow, print_logs
from ..run.ops import require_home


def add_parser(sub: Any) -> None:
    g = sub.add_parser("logs", help="what a run's attempts printed (stdout and stderr)")
    g.add_argument("run")
    g.add_argument("step", nargs="?", help="only this step (default: every step, in order)")
    g.add_argument("--attempt", type=int, metavar="N", help="only attempt N of STEP")
    g.add_argument("--follow", "-f", action="store_true",
                   help="keep printing until the run finishes or pauses")


def cmd_logs(a: argparse.Namespace, home: Home) -> int:
    require_home(home)
    if a.attempt is not None and a.attempt < 1:
        raise UsageError(f"--attempt must be >= 1, not {a.attempt}")
    if a.follow and a.attempt is not None:
        raise UsageError("--follow shows every attempt as it starts; drop --attempt")
    store = home.open_store()
    out = sys.stdout.buffer
    if a.follow:
        follow(home, store, a.run, a.step, out)
        return 0
    logs = attempt_logs(home, store, a.run, a.step, a.attempt)
    if a.attempt is not None and not logs[0].path.exists():
        raise SegueError(f"no log of attempt {a.attempt} of step {a.step!r} at {logs[0].path}: it "
                         f"ran before logs were kept per attempt (see `segue logs {a.run} {a.step}`)"
                         ", on another machine, or its log was deleted")
    print_logs(logs, out, headers=a.attempt is None)
    out.flush()
    return 0
