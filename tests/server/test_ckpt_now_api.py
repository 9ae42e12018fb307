"""`Client.checkpoint_now` over the server: POST /api/runs/{run}/checkpoint asks the running
step to checkpoint (operator, may pause the run's class), names its principal, and
refuses a viewer and a run with nothing running, as `segue ckpt now` does."""

from __future__ import annotations

from pathlib import Path

from conftest import BASE
from fastapi.testclient import TestClient
from segue_helpers import FLOWS, Segue, wait_for

from segue.home import Home


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Origin": BASE}


def test_checkpoint_now_over_the_api(segue: Segue, api: TestClient, tokens: dict[str, str], home: Home,
                                     tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    segue("run", str(FLOWS / "ondemand.py"), "--run-id", "od", "--detach", "-p", f"gate={gate}", check=True)
    store = home.open_store()
    wait_for(lambda: (store.get_task("od", "loop").progress_done or 0) > 0, 60, "the step running")
    assert store.list_checkpoints("od", "loop") == []

    assert api.post("/api/runs/od/checkpoint", headers=_auth(tokens["viewer"])).status_code == 403
    r = api.post("/api/runs/od/checkpoint", headers=_auth(tokens["op"]))
    assert r.status_code == 200 and r.json() == {"asked": ["loop"]}, r.text
    wait_for(lambda: len(store.list_checkpoints("od", "loop")) == 1, 60, "the asked-for checkpoint")
    asked = [e for e in store.list_events("od") if (e.data or {}).get("command") == "checkpoint_now"]
    assert [(e.actor, e.data["steps"]) for e in asked] == [("api:op", ["loop"])]

    gate.touch()
    segue.wait_state("od", {"SUCCEEDED"}, 60)
    r = api.post("/api/runs/od/checkpoint", headers=_auth(tokens["op"]))
    assert r.status_code == 400 and "has no running task on this host to checkpoint" in r.text, r.text
    assert len(store.list_checkpoints("od", "loop")) == 1  # one asked, none of its own
