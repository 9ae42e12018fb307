"""Entry point of a detached controller: ``python -m segue.run.daemon --home H --run R``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from ..errors import SegueError
from ..executor.ray_lean import own_process
from ..flow import load_flow
from ..home import Home
from ..hostname import use_host
from ..states import Actor, RunState
from . import ops
from .controller import Interrupts
from .outage import describe_store_failure, store_unwritable


def main(argv: list[str] | None = None) -> int:
    own_process()  # (segue.executor.ray_lean)
    p = argparse.ArgumentParser(prog="segue-controller")
    p.add_argument("--home", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--allow-code-change", action="store_true")
    p.add_argument("--pool", default=None, help="the host pool database (default $SEGUE_POOL)")
    p.add_argument("--claim-epoch", type=int, default=None,
                   help="a host agent's claim: take the controller lease over only at this epoch")
    p.add_argument("--prev-host", default=None, help="the host of the controller the agent replaced")
    p.add_argument("--host", default=None, help="this host's name (default $SEGUE_HOST_ID, else the hostname)")
    p.add_argument("--store-stdin", action="store_true",
                   help="read the home's store from stdin: one JSON line {\"store\": URL} (run.spawn)")
    a = p.parse_args(argv)
    claim = None if a.claim_epoch is None else (a.claim_epoch, a.prev_host)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if a.host:
        use_host(a.host)  # before anything records this host's name
    store_url = json.loads(sys.stdin.readline())["store"] if a.store_stdin else None
    home = Home.resolve(a.home, store=store_url)
    store = home.open_store()
    interrupts = Interrupts()
    # SIGTERM to a detached controller: pause gracefully (like a first ctrl-c).
    signal.signal(signal.SIGTERM, lambda s, f: interrupts.hit(s))  # events name the signal
    signal.signal(signal.SIGINT, lambda s, f: interrupts.hit(s))
    try:
        run = store.get_run(a.run)
        loaded = load_flow(run.flow_path)
        ops.check_code(run, loaded, a.allow_code_change)
        ctl = ops.make_controller(home, store, run, loaded, actor=Actor.CONTROLLER, interrupts=interrupts,
                                  pool=a.pool, claim=claim)
        final = ops.drive(ctl, reason="detached controller started" if claim is None else
                          f"controller started by the agent of host {ctl.host} (failover)")
    except SegueError as exc:
        print(f"segue: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a full disk at start-up: one line, not a traceback
        if not store_unwritable(exc):
            raise
        print(f"segue: {describe_store_failure(exc, home.db_path, a.run)}", file=sys.stderr)
        return 2
    logging.getLogger("segue.controller").info("run %s ended %s", a.run, final)
    return {RunState.SUCCEEDED: 0, RunState.PAUSED: 3}.get(final, 1)


if __name__ == "__main__":
    sys.exit(main())
