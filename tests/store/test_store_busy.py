"""A metadata store whose write lock another process holds (issue 35, §5).

A command fails after the busy timeout with one line naming the holder and
exit 4 (StoreBusyError), writing nothing; the controller of a running run
waits the lock out instead. The holder is a real process in ``BEGIN
IMMEDIATE``; every test gates on the file it writes once it holds the lock.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue.errors import EXIT_CONFLICT, StoreBusyError
from segue.store.sqlite import SQLiteStore

BUSY = {"SEGUE_STORE_BUSY_TIMEOUT_S": "0.5"}

FAILING_FLOW = '''
from segue import Flow

flow = Flow("fails")


@flow.step(retries=0)
def boom(ctx):
    raise RuntimeError("boom")
'''

HOLDER = """
import os, sqlite3, sys, time
db, held, release = sys.argv[1:4]
c = sqlite3.connect(db, isolation_level=None)
c.execute("BEGIN IMMEDIATE")
open(held, "w").close()
while not os.path.exists(release):
    time.sleep(0.01)
c.execute("ROLLBACK")
"""


@contextmanager
def write_lock(db: Path, tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Another process holds ``db``'s write lock until the block ends."""
    held, release = tmp / "held", tmp / "release"
    held.unlink(missing_ok=True)
    release.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(held), str(release)])
    try:
        wait_for(held.exists, 60, "the holder to take the write lock")
        yield proc
    finally:
        release.touch()
        proc.wait(60)


def failed_run(segue: Segue, tmp_path: Path) -> str:
    flow = tmp_path / "fails.py"
    flow.write_text(FAILING_FLOW)
    assert segue("run", str(flow), "--run-id", "r1").returncode == 1
    assert segue.status("r1")["state"] == "FAILED"
    return "r1"


LINE = re.compile(r"^segue: the metadata store \S+segue\.db is busy: pid (\d+) \(.*\) has held its "
                  r"write lock for over 0\.5s; nothing was written; retry when it lets go, or stop "
                  r"it if it is stuck \(\$SEGUE_STORE_BUSY_TIMEOUT_S sets how long segue waits\)\n$")


@pytest.mark.parametrize("command", [("resume", "--detach"), ("resume",), ("cancel",)])
def test_a_command_behind_a_held_write_lock_exits_4_with_one_line(
        segue: Segue, tmp_path: Path, command: tuple[str, ...]) -> None:
    run = failed_run(segue, tmp_path)
    before = (segue.status(run)["state"], segue.events(run))
    with write_lock(segue.home / "segue.db", tmp_path) as holder:
        proc = segue(command[0], run, *command[1:], env=BUSY, timeout=60)
        assert proc.returncode == EXIT_CONFLICT == 4, proc.stderr
        m = LINE.match(proc.stderr)
        assert m, proc.stderr
        assert int(m.group(1)) == holder.pid  # the holder is named, from the kernel's locks
        assert "Traceback" not in proc.stderr + proc.stdout
    assert (segue.status(run)["state"], segue.events(run)) == before  # nothing was written
    # Once the lock is free the same command goes through.
    assert segue("cancel", run).returncode == 0
    assert segue.status(run)["state"] == "CANCELLED"


def test_the_library_raises_store_busy_error_and_the_option_sets_the_wait(tmp_path: Path) -> None:
    db = tmp_path / "segue.db"
    store = SQLiteStore(db, busy_timeout_s=0.2)
    store.close()
    with write_lock(db, tmp_path):
        store = SQLiteStore(db, busy_timeout_s=0.2)  # a read-only open does not wait
        assert store.list_runs() == []  # WAL: reads go on while another process writes
        with pytest.raises(StoreBusyError, match=r"^the metadata store .* is busy: pid \d+ .*over 0\.2s"):
            store.append_event("r", "command", actor="cli", reason="x")  # busy before it looks
    store.close()


def test_a_bad_busy_timeout_is_one_line(segue: Segue) -> None:
    segue.home.mkdir()
    SQLiteStore(segue.home / "segue.db").close()
    proc = segue("ls", env={"SEGUE_STORE_BUSY_TIMEOUT_S": "soon"})
    assert proc.returncode == 2
    assert proc.stderr == ("segue: SEGUE_STORE_BUSY_TIMEOUT_S='soon' is not a number of seconds >= 0; "
                           "unset it or give one, e.g. SEGUE_STORE_BUSY_TIMEOUT_S=30\n")


def test_the_controller_waits_out_a_held_lock(segue: Segue, tmp_path: Path) -> None:
    """The controller's writes meet the same StoreBusyError and ride it out (run.outage)."""
    gate = tmp_path / "gate"
    assert segue("run", str(FLOWS / "counter.py"), "--run-id", "c", "-p", "n=20", "-p", "sleep=0",
                 "-p", f"hold={gate}", "--detach", env=BUSY).returncode == 0
    wait_for(lambda: segue.step("c", "count")["state"] == "RUNNING", 120, "count to run")
    log = segue.home / "logs" / "c" / "controller.log"
    with write_lock(segue.home / "segue.db", tmp_path):
        wait_for(lambda: "StoreBusyError" in log.read_text() or "is busy" in log.read_text(), 120,
                 "the controller to meet the held lock")
    gate.touch()
    assert segue.wait_state("c", {"SUCCEEDED", "FAILED", "PAUSED"}, 120)["state"] == "SUCCEEDED"


PG_HOLDER = """
import os, sys, time
import psycopg
url, run, held, release = sys.argv[1:5]
with psycopg.connect(url) as c:  # a transaction: the row stays locked until the block ends
    c.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", (run,))
    open(held, "w").close()
    while not os.path.exists(release):
        time.sleep(0.01)
"""


def test_postgres_a_command_behind_a_held_row_lock_exits_4(
        new_target: Callable[[str], str], tmp_path: Path) -> None:
    """PostgreSQL with $SEGUE_STORE_BUSY_TIMEOUT_S set: ``lock_timeout``, the same line and code."""
    url = new_target("postgres")
    segue = Segue(tmp_path / "home")
    segue.env["SEGUE_STORE"] = url
    run = failed_run(segue, tmp_path)
    before = (segue.status(run)["state"], segue.events(run))
    held, release = tmp_path / "held", tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", PG_HOLDER, url, run, str(held), str(release)])
    try:
        wait_for(held.exists, 60, "the holder to lock the run's row")
        proc = segue("cancel", run, env=BUSY, timeout=60)
    finally:
        release.touch()
        holder.wait(60)
    assert proc.returncode == 4, proc.stderr
    assert re.match(r"^segue: the metadata store postgresql://\S+ is busy: another session has held "
                    r"a lock this write needs for over 0\.5s; nothing was written; retry when it "
                    r"lets go \(\$SEGUE_STORE_BUSY_TIMEOUT_S sets how long segue waits\)\n$",
                    proc.stderr), proc.stderr
    assert (segue.status(run)["state"], segue.events(run)) == before
    assert segue("cancel", run).returncode == 0
