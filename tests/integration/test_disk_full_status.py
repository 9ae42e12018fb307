"""While another process fills the disk, status says the controller waits, not that it is gone.

The home is on a small tmpfs (test_disk_full's), filled by another file once
the run committed a checkpoint. The controller cannot renew its lease and
retries the store; `segue status` used to call it gone and suggest `segue
resume` while its pid was alive and retrying.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from segue_helpers import Segue, wait_for
from test_disk_full import N, Stderr, _committed, _flow, fill, tmpfs

from segue._procs import pid_alive


@pytest.mark.usefixtures("_test_pool")  # a pool of its own: no other test's cpus
def test_status_says_a_controller_waits_for_a_full_store(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "24m") as mnt:
        seg = Segue(mnt / "home")
        gate = tmp_path / "gate"
        run_id = "waits-1"
        proc = seg.popen("run", str(_flow(tmp_path)), "--run-id", run_id, "-p", f"gate={gate}", "-p", f"n={N}")
        err = Stderr(proc)
        try:
            wait_for(lambda: _committed(seg, run_id) or proc.poll() is not None, 120, "a committed checkpoint")
            assert proc.poll() is None, err.text
            filler = mnt / "someone-elses-file"
            assert fill(filler) > 0
            # Its lease lapses: it cannot write the store to renew it.
            st = wait_for(lambda: (d := seg.status(run_id))["problem"] and d, 120, "the lease to lapse")
            assert proc.poll() is None, err.text
            pid = st["controller"]["pid"]
            assert pid_alive(pid) and st["state"] == "RUNNING"
            problem = st["problem"]
            assert problem.startswith(f"controller waiting: its controller (pid {pid} on "), problem
            assert "gone" not in problem and "continues from the last checkpoints" not in problem
            assert "free space there and it carries on by itself" in problem
            assert st["controller"]["waiting"] is True and st["controller"]["alive"] is False
            m = re.search(rf"the filesystem of {re.escape(str(mnt / 'home'))} has ([0-9,]+) bytes free", problem)
            assert m, problem
            v = os.statvfs(mnt)
            assert abs(int(m.group(1).replace(",", "")) - v.f_bavail * v.f_frsize) <= 1 << 20, problem
            assert problem in seg("status", run_id).stdout
            filler.unlink()
            rc = proc.wait(timeout=120)  # it carried on by itself: it recorded the pause
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.close()
        assert rc == 3, err.text
        assert seg.status(run_id)["problem"] is None
