"""`segue output RUN STEP [--json]`: a step's return value (the CLI over segue.read_output)."""

from __future__ import annotations

import argparse
import pprint
from typing import Any

from ..client.local import LocalClient
from ..run.outputs import to_json
from .render import print_json


def add_parser(sub: Any) -> None:
    o = sub.add_parser("output", help="the value a step returned")
    o.add_argument("run")
    o.add_argument("step")
    o.add_argument("--json", action="store_true", help="as JSON (arrays become lists)")
    o.add_argument("--allow-pickle", action="store_true",
                   help="load an output the step saved with pickle (runs code from it: trust it)")


def cmd_output(a: argparse.Namespace, client: LocalClient) -> int:
    value = client.output(a.run, a.step, allow_pickle=a.allow_pickle, as_json=False)
    if a.json:
        print_json(to_json(value, f"output of step {a.step!r}"))
    else:
        print(pprint.pformat(value, sort_dicts=False))
    return 0
