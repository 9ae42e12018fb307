"""`segue verify FLOW.py`: the CLI shell over segue.verify."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..flow import load_flow, parse_overrides, resolve
from ..home import Home
from .render import print_json


def add_parser(sub: Any) -> None:
    v = sub.add_parser("verify", help="run a flow cleanly and under injected faults; compare outputs")
    v.add_argument("flow")
    v.add_argument("--param", "-p", action="append", default=[], metavar="K=V")
    v.add_argument("--kills", type=int, default=5, help="SIGKILLs of workers and controllers")
    v.add_argument("--pauses", type=int, default=2, help="pause/resume cycles")
    v.add_argument("--min-faults", type=int, default=None, metavar="N",
                   help="pass when at least N faults landed (default: every planned one)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--keep", metavar="DIR", help="keep both runs' sandboxes in DIR")
    v.add_argument("--ignore-output", action="append", default=[], metavar="STEP",
                   help="do not compare this step's return value (e.g. it reports timings)")
    v.add_argument("--json", action="store_true")


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped(signum)


def cmd_verify(a: argparse.Namespace, home: Home, *, pool: Path | str | None = None) -> int:
    from ..verify import run_verify  # the comparison imports NumPy: only when verifying
    from ..verify.reaper import Watchdog, reap

    flow = Path(a.flow)
    loaded = load_flow(flow)  # validates the file and the DAG before anything runs
    resolve(loaded.flow.params, parse_overrides(a.param))  # and the parameters
    if a.kills < 0 or a.pauses < 0:
        raise UsageError("--kills and --pauses must be >= 0")
    if a.min_faults is not None and not 0 <= a.min_faults <= a.kills + a.pauses:
        raise UsageError(f"--min-faults must be from 0 to --kills + --pauses ({a.kills + a.pauses})")
    if a.keep and Path(a.keep).exists() and (not Path(a.keep).is_dir() or any(Path(a.keep).iterdir())):
        raise UsageError(f"--keep directory {a.keep} is not an empty directory; pick a new one")
    base = Path(a.keep).resolve() if a.keep else Path(tempfile.mkdtemp(prefix="segue-verify-"))
    base.mkdir(parents=True, exist_ok=True)
    log = (lambda s: None) if a.json else (lambda s: print(s, file=sys.stderr, flush=True))
    # Whatever ends this process, its controllers, workers and (without --keep)
    # sandbox go: SIGTERM and SIGINT unwind to the finally below; SIGKILL
    # leaves it to the watchdog, which sees this process's pipe close.
    watchdog = Watchdog(base, remove=not a.keep)
    old = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rep = run_verify(flow, a.param, kills=a.kills, pauses=a.pauses, seed=a.seed, base=base,
                         log=log, ignore_outputs=set(a.ignore_output), min_faults=a.min_faults,
                         pool=pool, store=home.store)
    except _Stopped as stop:
        print(f"segue: verify stopped by {stop}; its controllers and workers were killed"
              + ("" if a.keep else " and its sandbox removed"),
              file=sys.stderr)
        return 128 + stop.signum
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        reap(base, remove=not a.keep)
        watchdog.close()
    doc = rep.to_json()
    if a.json:
        print_json(doc)
    else:
        print(f"verify: {rep.verdict}" + ("" if rep.enough_faults else " (NOT PROVEN: too few faults landed)"))
        print(f"  faults planned {rep.planned} {doc['faults_planned']}, landed {rep.landed} "
              f"{doc['faults_landed']}, needed {doc['min_faults']}")
        for f in doc["faults_missed"]:
            print(f"  missed: {f['kind']} at {100 * f['at']:.0f}% ({f.get('why', '')})")
        print(f"  records compared {doc['records_compared']}, lost {doc['records_lost']}, duplicated "
              f"{doc['records_duplicated']}, differing {doc['records_differing']}")
        if doc["differing_step_outputs"]:
            print(f"  step outputs that differ: {', '.join(doc['differing_step_outputs'])}")
        for ex in doc["examples"]:
            print(f"  e.g. {ex}")
        print(f"  clean {doc['clean_s']}s, faulted {doc['faulted_s']}s, time lost to recovery "
              f"{doc['time_lost_to_recovery_s']}s (work redone {doc['work_redone_s']}s)")
    for line in rep.problems():  # a comparison that proved nothing is a failure, never IDENTICAL
        print(f"segue: {line}", file=sys.stderr)
    if rep.identical and not rep.enough_faults:
        print(f"segue: only {rep.landed} of {rep.planned} faults landed (needed {doc['min_faults']}); "
              f"use a longer run or allow fewer with --min-faults", file=sys.stderr)
    return 0 if rep.ok else 1
