"""A disk filled by someone else during a run: the run pauses with the reason, then resumes.

Regression for issue 8, 2.2: the controller died with "database or disk is full"
(in its exit handler, then again releasing its lease), its worker died with it,
and the run stayed RUNNING with no process and no recorded error.

The real test puts the home on a small tmpfs and fills it with another file once
the run has committed a checkpoint; the others need no root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from segue_helpers import Segue, wait_for

from segue.errors import StoreError, exit_code

FLOW = '''
import os
import time

import numpy as np

from segue import Flow

flow = Flow("diskfill", params={"n": 200, "gate": "", "sleep": 0.003})


@flow.step(retries=3, checkpoint_every="50ms")
def grind(ctx):
    p = ctx.params
    state = ctx.restore()
    if state is None:
        state = {"i": 0, "acc": 0, "w": np.zeros(64 * 1024, dtype=np.uint8)}
    while state["i"] < p["n"]:
        # Halfway, wait for the test's gate, checkpointing all along: those saves
        # are what meets the full disk.
        if state["i"] >= p["n"] // 2 and p["gate"] and not os.path.exists(p["gate"]):
            time.sleep(0.01)
            if ctx.checkpoint_due(state["i"]):
                ctx.checkpoint(state, position={"i": state["i"]})
            continue
        state["i"] += 1
        state["acc"] += state["i"] * state["i"]
        state["w"][:] = state["i"] % 251
        time.sleep(p["sleep"])
        ctx.progress(state["i"], p["n"])
        if ctx.checkpoint_due(state["i"]):
            ctx.checkpoint(state, position={"i": state["i"]})
    return {"acc": state["acc"], "i": state["i"]}
'''
N = 200
EXPECTED = sum(i * i for i in range(1, N + 1))


class Stderr:
    """Collects a child's stderr in a thread, so the test can wait for a line.

    Its stdout (the run display) is drained too, so a full pipe never blocks it.
    """

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stderr is not None and proc.stdout is not None
        self._t = threading.Thread(target=self._pump, args=(proc.stderr, self.lines), daemon=True)
        self._t.start()
        self._out: list[str] = []
        self._t_out = threading.Thread(target=self._pump, args=(proc.stdout, self._out),
                                       daemon=True)
        self._t_out.start()
        self._proc = proc

    def close(self) -> None:
        """After the process ended: read to the end, close the pipes."""
        self._t.join(30)
        self._t_out.join(30)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()

    @staticmethod
    def _pump(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    @property
    def text(self) -> str:
        return "".join(self.lines)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount, which needs root "
                    "(test_store_write_fault_is_ridden_out covers the controller without one)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); "
                    "test_store_write_fault_is_ridden_out covers the controller without one")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem is full; the bytes written."""
    n = 0
    block = b"\xff" * (1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                n += os.write(fd, block if n % (1 << 20) == 0 else block[: 4096])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(block) > 4096:  # top up the last pages too
                    block = block[:4096]
                    continue
                return n
    finally:
        os.close(fd)


def _flow(tmp_path: Path) -> Path:
    f = tmp_path / "diskfill.py"
    f.write_text(FLOW)
    return f


def _committed(seg: Segue, run_id: str) -> bool:
    try:
        st = seg.status(run_id)
    except (AssertionError, ValueError):
        return False
    return any(s["last_checkpoint"] for s in st["steps"])


@pytest.mark.usefixtures("_test_pool")  # a pool of its own: no other test's cpus
def test_disk_filled_by_another_file_pauses_then_resumes(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "24m") as mnt:
        seg = Segue(mnt / "home")
        gate = tmp_path / "gate"
        run_id = "full-1"
        proc = seg.popen("run", str(_flow(tmp_path)), "--run-id", run_id,
                         "-p", f"gate={gate}", "-p", f"n={N}")
        err = Stderr(proc)
        try:
            wait_for(lambda: _committed(seg, run_id) or proc.poll() is not None, 120,
                     "a committed checkpoint")
            assert proc.poll() is None, err.text
            filler = mnt / "someone-elses-file"
            assert fill(filler) > 0
            # The controller says so on stderr (pipes need no disk space): the
            # worker's checkpoint met the full disk, or the store did.
            wait_for(lambda: err.has("disk full") or proc.poll() is not None, 120,
                     "the controller to report the full disk")
            assert err.has("disk full"), err.text
            filler.unlink()
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.close()
        assert "Traceback" not in err.text, err.text
        assert rc == 3, f"the run must end PAUSED (exit 3), not {rc}\n{err.text}"
        st = seg.status(run_id)
        assert st["state"] == "PAUSED"
        assert st["problem"] is None
        said = [e["reason"] or "" for e in seg.events(run_id)] + [s["error"] or ""
                                                                   for s in st["steps"]]
        lines = [r for r in said if "disk full" in r]
        assert lines, said
        assert any(f"`segue resume {run_id}`" in r and f"free space under {mnt}" in r
                   for r in lines), lines
        text = seg("status", run_id)
        assert "disk full" in text.stdout, text.stdout

        gate.touch()
        res = seg("resume", run_id, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert seg.status(run_id)["state"] == "SUCCEEDED"
        out = seg.output(run_id, "grind")
        assert out == {"acc": EXPECTED, "i": N}


@pytest.mark.usefixtures("_test_pool")  # a pool of its own: no other test's cpus
def test_store_write_fault_is_ridden_out(tmp_path: Path) -> None:
    """A store write refused with ENOSPC once: the controller retries and the run finishes."""
    seg = Segue(tmp_path / "home")
    run_id = "fault-1"
    gate = tmp_path / "gate"
    # The 8th store write of the controller process fails: past start-up (six
    # writes), inside the loop, which renews its lease while the step waits at
    # the gate, so the fault lands however slow the machine is.
    env = {"SEGUE_FAULTS": "store.before_commit:enospc:8", "SEGUE_FAULTS_IN": "controller"}
    proc = seg.popen("run", str(_flow(tmp_path)), "--run-id", run_id, "-p", f"gate={gate}",
                     "-p", f"n={N}", env=env)
    err = Stderr(proc)
    try:
        wait_for(lambda: err.has("cannot be written") or proc.poll() is not None, 120,
                 "the injected store fault")
        gate.touch()
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    assert "Traceback" not in err.text, err.text
    # The fault landed (the controller said so) and was ridden out.
    assert err.has("the metadata store cannot be written"), err.text
    assert rc == 0, err.text
    assert seg.output(run_id, "grind") == {"acc": EXPECTED, "i": N}


def _start_gated(seg: Segue, tmp_path: Path, run_id: str, env: dict[str, str]
                 ) -> tuple[subprocess.Popen[str], Stderr, Path]:
    gate = tmp_path / "gate"
    proc = seg.popen("run", str(_flow(tmp_path)), "--run-id", run_id, "-p", f"gate={gate}",
                     "-p", f"n={N}", env=env)
    return proc, Stderr(proc), gate


@pytest.mark.usefixtures("_test_pool")  # a pool of its own: no other test's cpus
def test_store_full_for_a_while_pauses_with_the_reason(tmp_path: Path) -> None:
    """Every store write of the controller fails for a while (writes 8 to 40): it
    stops the attempt, keeps retrying, records the pause once it can, and exits."""
    seg = Segue(tmp_path / "home")
    run_id = "outage-1"
    env = {"SEGUE_FAULTS": "store.before_commit:enospc:8-40", "SEGUE_FAULTS_IN": "controller"}
    proc, err, gate = _start_gated(seg, tmp_path, run_id, env)
    try:
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    assert "Traceback" not in err.text, err.text
    assert err.has("stopping its attempts"), err.text  # the outage outlasted the grace
    assert rc == 3, err.text
    st = seg.status(run_id)
    assert st["state"] == "PAUSED" and st["problem"] is None
    assert st["steps"][0]["state"] == "PARKED"
    paused = [e for e in seg.events(run_id) if e.get("to_state") == "PAUSED"]
    assert paused and paused[-1]["reason"].startswith("disk full writing the metadata store"), paused
    assert f"then `segue resume {run_id}`" in paused[-1]["reason"]
    gate.touch()
    res = seg("resume", run_id, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert seg.output(run_id, "grind") == {"acc": EXPECTED, "i": N}


@pytest.mark.usefixtures("_test_pool")
def test_store_never_writable_gives_up_and_status_says_so(tmp_path: Path) -> None:
    """Nothing can be written at all: the controller gives up with one line, and
    status reports a RUNNING run with no controller instead of a live-looking one."""
    seg = Segue(tmp_path / "home")
    run_id = "outage-2"
    env = {"SEGUE_FAULTS": "store.before_commit:enospc:8-1000000",
           "SEGUE_FAULTS_IN": "controller", "SEGUE_STORE_WAIT_S": "12"}
    proc, err, gate = _start_gated(seg, tmp_path, run_id, env)
    try:
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    assert "Traceback" not in err.text, err.text
    assert rc == exit_code(StoreError("")), err.text
    last = [line for line in err.lines if line.startswith("segue: ")]
    assert last and "gave up after" in last[-1] and "left RUNNING with no controller" in last[-1]
    st = seg.status(run_id)
    assert st["state"] == "RUNNING"
    assert st["problem"] and st["problem"].startswith("no controller:"), st
    gate.touch()
    res = seg("resume", run_id, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert seg.output(run_id, "grind") == {"acc": EXPECTED, "i": N}


@pytest.mark.usefixtures("_test_pool")  # a pool of its own: no other test's cpus
def test_status_reports_a_run_whose_controller_died(tmp_path: Path) -> None:
    """Nothing could be recorded (SIGKILL here): status must still say the run is orphaned."""
    seg = Segue(tmp_path / "home")
    gate = tmp_path / "gate"
    run_id = "orphan-1"
    proc = seg.popen("run", str(_flow(tmp_path)), "--run-id", run_id,
                     "-p", f"gate={gate}", "-p", f"n={N}")
    err = Stderr(proc)
    try:
        wait_for(lambda: _committed(seg, run_id) or proc.poll() is not None, 120,
                 "a committed checkpoint")
        assert proc.poll() is None
        assert seg.status(run_id)["problem"] is None  # alive: nothing to report
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    st = seg.status(run_id)
    assert st["state"] == "RUNNING"
    assert st["problem"] and st["problem"].startswith("no controller:"), st
    assert f"`segue resume {run_id}`" in st["problem"]
    assert "no controller:" in seg("status", run_id).stdout
    gate.touch()
    res = seg("resume", run_id, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert seg.output(run_id, "grind") == {"acc": EXPECTED, "i": N}
