"""`segue logs RUN [STEP] [--attempt N] [--follow]`: the output of a run's attempts."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..client.local import LocalClient
from ..errors import UsageError


def add_parser(sub: Any) -> None:
    g = sub.add_parser("logs", help="what a run's attempts printed (stdout and stderr)")
    g.add_argument("run")
    g.add_argument("step", nargs="?", help="only this step (default: every step, in order)")
    g.add_argument("--attempt", type=int, metavar="N", help="only attempt N of STEP")
    g.add_argument("--follow", "-f", action="store_true",
                   help="keep printing until the run finishes or pauses")


def cmd_logs(a: argparse.Namespace, client: LocalClient) -> int:
    if a.attempt is not None and a.attempt < 1:
        raise UsageError(f"--attempt must be >= 1, not {a.attempt}")
    if a.follow and a.attempt is not None:
        raise UsageError("--follow shows every attempt as it starts; drop --attempt")
    out = sys.stdout.buffer
    for chunk in client.log_bytes(a.run, a.step, attempt=a.attempt, follow=a.follow):
        out.write(chunk)
        out.flush()
    return 0
