"""One "agent" of the schedule race tests: ``python _schedule_racer.py TARGET HOME HOST OUT``.

It runs the real firing loop (``segue.run.schedules.ScheduleFirer``) against the store
at TARGET (an SQLite path or a PostgreSQL URL), on the test's virtual clock
(``SEGUE_CLOCK_FILE``), ticking every 20 ms until killed. The one seam: a claimed run's
controller is not a process of its own but done here in line, as a controller that
finishes at once would (take the claim over, RUNNING, SUCCEEDED, release), so a hundred
slots need no hundred controllers. Each slot fired and each run started is appended to
OUT as one JSON line. Prints ``ready`` once its store is open.
"""

from __future__ import annotations

import json
import os
import sys
import time

from _store_helpers import open_target

from segue.home import Home
from segue.states import Actor, RunState
from segue.store.base import RunRecord


def main() -> None:
    target, home_dir, host, out_path = sys.argv[1:5]
    store = open_target(target)
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - one line per write, for the life of the process

    def finish(run: RunRecord, claim: int) -> None:
        epoch = store.acquire_controller(run.run_id, pid=os.getpid(), host=host, ttl_s=10, expect_epoch=claim)
        store.transition_run(run.run_id, RunState.RUNNING, actor=Actor.CONTROLLER, reason="race",
                             controller_epoch=epoch)
        store.transition_run(run.run_id, RunState.SUCCEEDED, actor=Actor.CONTROLLER, reason="race",
                             controller_epoch=epoch)
        store.release_controller(run.run_id, epoch)
        out.write(json.dumps({"started": run.run_id, "host": host, "claim": claim}) + "\n")

    from segue.run.schedules import ScheduleFirer

    firer = ScheduleFirer(Home.resolve(home_dir), store, host=host, start=finish)
    print("ready", flush=True)
    while True:
        for f in firer.tick():
            out.write(json.dumps({"fired": f.run_id, "action": f.action, "host": host}) + "\n")
        time.sleep(0.02)


if __name__ == "__main__":
    main()
