"""`segue verify FLOW.py`: the CLI shell over segue.verify."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..flow import load_flow, parse_overrides, resolve
from ..home import Home
from ..verify import run_verify
from .render import print_json


def add_parser(sub: Any) -> None:
    v = sub.add_parser("verify", help="run a flow cleanly and under injected faults; compare outputs")
    v.add_argument("flow")
    v.add_argument("--param", "-p", action="append", default=[], metavar="K=V")
    v.add_argument("--kills", type=int, default=5, help="SIGKILLs of workers and controllers")
    v.add_argument("--pauses", type=int, default=2, help="pause/resume cycles")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--keep", metavar="DIR", help="keep both runs' sandboxes in DIR")
    v.add_argument("--ignore-output", action="append", default=[], metavar="STEP",
                   help="do not compare this step's return value (e.g. it reports timings)")
    v.add_argument("--json", action="store_true")


def cmd_verify(a: argparse.Namespace, home: Home) -> int:
    flow = Path(a.flow)
    loaded = load_flow(flow)  # validates the file and the DAG before anything runs
    resolve(loaded.flow.params, parse_overrides(a.param))  # and the parameters
    if a.kills < 0 or a.pauses < 0:
        raise UsageError("--kills and --pauses must be >= 0")
    base = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="segue-verify-"))
    if a.keep and base.exists() and any(base.iterdir()):
        raise UsageError(f"--keep directory {base} is not empty; pick a new one")
    log = (lambda s: None) if a.json else (lambda s: print(s, file=sys.stderr, flush=True))
    try:
        rep = run_verify(flow, a.param, kills=a.kills, pauses=a.pauses, seed=a.seed, base=base,
                         log=log, ignore_outputs=set(a.ignore_output))
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    doc = rep.to_json()
    if a.json:
        print_json(doc)
    else:
        verdict = "IDENTICAL" if rep.ok else "DIFFERENT"
        print(f"verify: {verdict}")
        print(f"  faults injected: {doc['faults_injected']}")
        print(f"  records compared {doc['records_compared']}, lost {doc['records_lost']}, duplicated "
              f"{doc['records_duplicated']}, differing {doc['records_differing']}")
        if doc["differing_step_outputs"]:
            print(f"  step outputs that differ: {', '.join(doc['differing_step_outputs'])}")
        for ex in doc["examples"]:
            print(f"  e.g. {ex}")
        print(f"  clean {doc['clean_s']}s, faulted {doc['faulted_s']}s, time lost to recovery "
              f"{doc['time_lost_to_recovery_s']}s (work redone {doc['work_redone_s']}s)")
    return 0 if rep.ok else 1
