"""Starting a run's controller as a detached process of its own.

Apart from ``run.ops`` (which builds on the controller) so the controller can
start another run's controller (a preempted run resumes by itself) without
importing ops.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from ..executor.local import write_options
from ..home import Home
from ..hostname import given_host
from ..store.postgres import is_postgres_url


def spawn_detached(home: Home, run_id: str, *, allow_code_change: bool = False,
                   pool: str | os.PathLike[str] | None = None,
                   claim: tuple[int, str | None] | None = None, host: str | None = None) -> int:
    """Start a controller in its own session; it outlives this process. ``pool``:
    the host pool it uses (default: the one ``$SEGUE_POOL`` names). ``claim``: a
    host agent's (controller epoch, previous controller's host); the controller
    takes the lease over only at that epoch (see run.hostagent). ``host``: this
    host's name (default: the one this process was given, if any).

    Everything is passed explicitly, nothing through the environment: the options
    on the command line, and the home's explicit store (``home.store``, a URL that
    may hold a password) as one JSON line on the controller's stdin, which no other
    user can read (a command line is world-readable)."""
    log = home.logs_dir(run_id) / "controller.log"
    cmd = [sys.executable, "-m", "segue.run.daemon", "--home", str(home.root), "--run", run_id]
    if pool is not None and not is_postgres_url(str(pool)):
        cmd += ["--pool", str(pool)]  # a cluster's pool is the home's store: no URL in argv
    host = host or given_host()
    if host:
        cmd += ["--host", host]
    if claim is not None:
        cmd += ["--claim-epoch", str(claim[0])] + (["--prev-host", claim[1]] if claim[1] else [])
    if allow_code_change:
        cmd.append("--allow-code-change")
    if home.store:
        cmd.append("--store-stdin")
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.PIPE if home.store else subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    write_options(proc, {"store": home.store})  # (a no-op without the pipe)
    # A long-lived caller (a server, a notebook) must reap it when it exits, or
    # zombies pile up; the thread holds the only reference until then.
    threading.Thread(target=proc.wait, name=f"reap-controller-{proc.pid}", daemon=True).start()
    return proc.pid
