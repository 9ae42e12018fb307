"""`segue server` fires the home's schedules too: with no agent running, a due slot's
run is created by the server's thread, started by a real controller, and completes."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from segue_helpers import FLOWS, Segue, VirtualClock, wait_for

from segue.home import Home
from segue.scheduler.schedules import slot_run_id
from segue.server import create_app


@pytest.mark.timeout(180)
def test_the_server_fires_a_due_slot(segue: Segue, home: Home, _test_pool: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualClock(tmp_path / "clock")
    monkeypatch.setenv("SEGUE_CLOCK_FILE", str(tmp_path / "clock"))  # the server's store, and its controllers
    segue.env.update(clock.env)
    assert segue("schedule", "add", "tick", str(FLOWS / "counter.py"), "--cron", "* * * * *",
                 "-p", "n=2", "-p", "sleep=0").returncode == 0
    first = segue.json("schedule", "ls")[0]["next_slot"]
    with TestClient(create_app(home, pool=_test_pool, auth=False), base_url="http://127.0.0.1") as api:
        clock.advance(first + 1 - clock())
        run_id = slot_run_id("tick", first)
        wait_for(lambda: segue.json("schedule", "ls")[0]["last_run_state"] == "SUCCEEDED", 120,
                 f"the server to fire {run_id} and its run to complete")
        assert api.get(f"/api/runs/{run_id}").status_code == 200
    created = [e for e in segue.events(run_id) if e["kind"] == "run" and e["to_state"] == "PENDING"]
    assert created[0]["actor"] == "schedule:tick"
    assert segue.output(run_id, "count")["i"] == 2
