"""kill -9 of `segue server` while runs it started execute: the runs never notice.

The server starts each run's controller detached (``ops.spawn_detached``: its own
session, no inherited descriptors), so its death takes neither the controllers
nor their workers along. After proving the kill landed (the pid is gone, a
request fails at the transport level), the test requires both runs to keep
committing checkpoints, finish SUCCEEDED on their first attempt with the output
of an uninterrupted reference run, and a server restarted over the same home,
on the same port, to show them.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest
from segue_helpers import FLOWS, Segue, wait_for
from serverkit import ServerProcess, pid_alive

from segue.home import Home

pytest.importorskip("fastapi", reason="segue server needs the server extra (pip install 'segue[server]')")

N = 1000  # as in test_server_load: the reference run is computed once per session


def test_kill_9_of_the_server_leaves_its_runs_running(tmp_path: Path, _test_pool: Path, segue: Segue,
                                                      counter_ref) -> None:
    ref = counter_ref(N)
    srv = ServerProcess(segue.home, _test_pool, tmp_path).start()
    gates = {name: tmp_path / f"gate-{name}" for name in ("a", "b")}
    runs: dict[str, str] = {}
    try:
        with srv.client(timeout=120) as c:
            for name, gate in gates.items():
                r = c.post("/api/runs", json={"flow": str(FLOWS / "counter.py"), "run_id": f"kill-{name}",
                                              "params": {"n": N, "sleep": 0.004, "hold": str(gate)}})
                assert r.status_code == 201, r.text
                runs[name] = r.json()["run_id"]
        store = Home.resolve(segue.home).open_store()

        def executing(run: str) -> bool:
            t = store.get_task(run, "count")
            return t.state.value == "RUNNING" and bool(t.pid) and (t.progress_done or 0) > 0

        for run in runs.values():
            wait_for(lambda run=run: executing(run), 180, f"run {run} to execute")
        controllers = {run: store.get_run(run).controller_pid for run in runs.values()}
        workers = {run: store.get_task(run, "count").pid for run in runs.values()}
        for run, pid in controllers.items():
            assert pid and pid_alive(pid), f"no live controller for {run}"
            assert os.getsid(pid) != os.getsid(srv.pid), f"the controller of {run} is in the server's session"
        seq_at_kill = {run: max(ck.seq for ck in store.list_checkpoints(run, "count")) for run in runs.values()}

        # -- kill -9, and prove it landed --------------------------------------------------
        server_pid = srv.pid
        assert srv.kill() == -signal.SIGKILL
        assert not pid_alive(server_pid)
        with pytest.raises(httpx.TransportError):
            httpx.get(srv.url + "/healthz", headers=srv.headers, timeout=10)

        # -- the runs never noticed --------------------------------------------------------
        for run in runs.values():
            assert pid_alive(controllers[run]) and pid_alive(workers[run]), f"run {run} lost a process"
            wait_for(lambda run=run: max(ck.seq for ck in store.list_checkpoints(run, "count"))
                     > seq_at_kill[run], 120, f"run {run} to commit a checkpoint after the kill")
            assert store.get_run(run).state.value == "RUNNING"
        for gate in gates.values():
            gate.write_text("go")
        for run in runs.values():
            wait_for(lambda run=run: store.get_run(run).state.value in ("SUCCEEDED", "FAILED", "CANCELLED"),
                     240, f"run {run} to finish")
            assert store.get_run(run).state.value == "SUCCEEDED"
            count = store.get_task(run, "count")
            assert (count.attempts, count.failures) == (1, 0), "the worker was restarted"
            got = segue.output(run, "count")
            assert got["i"] == N and got["acc"] == ref["count"]["acc"]
            np.testing.assert_array_equal(got["hist"], ref["count"]["hist"])
            out = segue("output", run, "report", "--json")
            assert out.returncode == 0 and json.loads(out.stdout) == ref["report"], out.stderr

        # -- a new server over the same home, on the same URL, shows them ------------------
        again = ServerProcess(segue.home, _test_pool, tmp_path, token=srv.token, port=srv.port).start()
        try:
            with again.client(timeout=120) as c:
                listed = {r["run_id"]: r["state"] for r in c.get("/api/runs").raise_for_status().json()}
                assert listed == {run: "SUCCEEDED" for run in runs.values()}
                for run in runs.values():
                    assert c.get(f"/api/runs/{run}").json()["state"] == "SUCCEEDED"
                    out = c.get(f"/api/runs/{run}/steps/report/output").raise_for_status().json()
                    assert out["value"] == ref["report"]
        finally:
            again.stop()
    finally:
        for gate in gates.values():
            gate.write_text("go")
        srv.stop()
