"""Access rules of `segue server`: tokens, roles, priority classes, origins, URLs and paths.

The app is the real one over a real home (FastAPI's TestClient speaks ASGI to
it in-process); the bind refusals start the real CLI.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from segue_helpers import FLOWS, Segue, wait_for  # noqa: E402

from segue.home import Home  # noqa: E402

COUNTER = str(FLOWS / "counter.py")


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _held_run(segue: Segue, tmp_path: Path, run_id: str, priority: str = "normal") -> None:
    proc = segue("run", COUNTER, "--run-id", run_id, "-p", "n=5", "-p", f"hold={tmp_path / 'never'}",
                 "--priority", priority, "--detach")
    assert proc.returncode == 0, proc.stderr
    # Steer it only once its attempt runs (a PENDING run pauses without PAUSING).
    wait_for(lambda: segue.step(run_id, "count")["last_checkpoint"], what=f"a checkpoint of {run_id}")


def test_token_file_is_private_and_hashed(home: Home, tokens: dict[str, str]) -> None:
    path = home.root / "tokens.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert all(t not in text for t in tokens.values())  # only digests are stored
    assert all(len(t) >= len("sgt_") + 43 for t in tokens.values())  # 256 random bits


def test_no_token_401_wrong_token_401_and_query_tokens_refused(api: TestClient, tokens: dict[str, str]) -> None:
    r = api.get("/api/runs")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "token is required" in r.json()["error"]
    assert api.get("/api/runs", headers=_auth("sgt_wrong")).status_code == 401
    assert api.get("/api/runs", headers={"Authorization": f"Basic {tokens['admin']}"}).status_code == 401
    # A valid token in the URL is refused, even with a valid header beside it.
    for name in ("token", "access_token", "api_key"):
        r = api.get(f"/api/runs?{name}={tokens['admin']}", headers=_auth(tokens["admin"]))
        assert r.status_code == 401 and "URL" in r.json()["error"], name
    assert api.get("/api/runs", headers=_auth(tokens["viewer"])).status_code == 200


def test_roles_and_priority_classes(api: TestClient, tokens: dict[str, str], segue: Segue,
                                    tmp_path: Path) -> None:
    _held_run(segue, tmp_path, "normal1", "normal")
    _held_run(segue, tmp_path, "batch1", "batch")
    for run in ("normal1", "batch1"):  # a viewer reads, never steers
        assert api.get(f"/api/runs/{run}", headers=_auth(tokens["viewer"])).status_code == 200
        r = api.post(f"/api/runs/{run}/pause", headers=_auth(tokens["viewer"]))
        assert r.status_code == 403 and "needs operator" in r.json()["error"]
    # An operator limited to batch may pause the batch run, not the normal one.
    r = api.post("/api/runs/normal1/pause", headers=_auth(tokens["batchop"]))
    assert r.status_code == 403 and "class 'normal'" in r.json()["error"]
    assert api.get("/api/runs/normal1", headers=_auth(tokens["op"])).json()["state"] != "PAUSING"
    r = api.post("/api/runs/batch1/pause", json={"wait": True, "timeout": 60}, headers=_auth(tokens["batchop"]))
    assert r.status_code == 200 and r.json()["state"] == "PAUSED"
    # Every mutation is an event naming its principal.
    actors = [e["actor"] for e in api.get("/api/runs/batch1/events", headers=_auth(tokens["viewer"])).json()
              if e["to_state"] == "PAUSING"]
    assert actors == ["api:batchop"]
    # Submitting counts as resuming: batchop may not start urgent work.
    r = api.post("/api/runs", json={"flow": COUNTER, "priority": "urgent"}, headers=_auth(tokens["batchop"]))
    assert r.status_code == 403
    # The pool is the admin's.
    body = {"gpus": 2}
    assert api.put("/api/pool", json=body, headers=_auth(tokens["op"])).status_code == 403
    r = api.put("/api/pool", json=body, headers=_auth(tokens["admin"]))
    assert r.status_code == 200 and len(r.json()["devices"]) == 2
    for run in ("normal1", "batch1"):
        api.post(f"/api/runs/{run}/cancel", headers=_auth(tokens["admin"]))


def test_origin_checks_on_mutations_and_streams(api: TestClient, tokens: dict[str, str], segue: Segue,
                                                tmp_path: Path) -> None:
    _held_run(segue, tmp_path, "o1")
    evil = {**_auth(tokens["op"]), "Origin": "http://evil.example"}
    r = api.post("/api/runs/o1/pause", headers=evil)
    assert r.status_code == 403 and "origin" in r.json()["error"]
    assert api.get("/api/runs/o1/events?follow=true", headers=evil).status_code == 403
    # The cookie (the web UI's way) needs an Origin on a mutation: no Origin, no change.
    api.cookies.set("segue_token", tokens["op"])
    assert api.post("/api/runs/o1/pause").status_code == 403
    assert api.get("/api/runs/o1").json()["state"] == "RUNNING"
    r = api.post("/api/runs/o1/cancel", headers={"Origin": "http://127.0.0.1:8765"})
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"


def test_bad_input_is_4xx_and_writes_nothing(api: TestClient, tokens: dict[str, str], home: Home) -> None:
    h = _auth(tokens["admin"])
    assert api.get("/api/runs", headers=h).json() == []  # the store exists from here on
    before = sorted(str(p.relative_to(home.root)) for p in home.root.rglob("*") if "segue.db" not in p.name)
    r = api.get("/api/runs/nope", headers=h)
    assert r.status_code == 404 and r.json() == {
        "error": "unknown run 'nope'; GET /api/runs lists the runs in this home", "type": "UnknownRunError"}
    for bad in ("..", "a/../../etc", "%2e%2e%2fetc", "x%0Ay"):
        assert api.get(f"/api/runs/{bad}", headers=h).status_code in (400, 404), bad
    assert api.get("/api/runs/nope/steps/..%2f..%2fsegue.db/output", headers=h).status_code in (400, 404)
    assert api.get("/api/runs/nope/logs?step=../../segue", headers=h).status_code == 400
    r = api.post("/api/runs", json={"flow": COUNTER, "gpus": "two"}, headers=h)
    assert r.status_code == 422 and "gpus" in r.json()["error"]
    r = api.post("/api/runs", json={"flow": COUNTER, "colour": "red"}, headers=h)
    assert r.status_code == 422 and "colour" in r.json()["error"]
    r = api.post("/api/runs", json={"flow": COUNTER, "params": {"n": "many"}}, headers=h)
    assert r.status_code == 400 and r.json()["type"] == "ParamError"
    r = api.post("/api/runs", json={"flow": str(home.root / "missing.py")}, headers=h)
    assert r.status_code == 400 and r.json()["type"] == "FlowError"
    assert api.get("/api/runs", headers=h).json() == []
    assert sorted(str(p.relative_to(home.root)) for p in home.root.rglob("*")
                  if "segue.db" not in p.name) == before  # no run directory, no log
    from segue.store import open_store

    assert open_store(home.root).list_runs() == []


def test_non_loopback_bind_without_auth_is_refused(tmp_path: Path, _test_pool: Path) -> None:
    env = {**os.environ, "SEGUE_POOL": str(_test_pool)}
    proc = subprocess.run([sys.executable, "-m", "segue", "--home", str(tmp_path / "h"), "server",
                           "--host", "0.0.0.0", "--no-auth"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("segue: refusing to serve 0.0.0.0 without tokens")
    assert not (tmp_path / "h").exists()


def test_token_cli(tmp_path: Path, _test_pool: Path) -> None:
    s = Segue(tmp_path / "home")
    proc = s("token", "create", "alice", "--role", "operator", "--may-resume", "batch,normal")
    assert proc.returncode == 0 and proc.stdout.startswith("sgt_")
    listed: list[dict[str, Any]] = s.json("token", "list")
    assert listed == [{"name": "alice", "role": "operator", "may_pause": ["*"],
                       "may_resume": ["normal", "batch"]}]
    assert proc.stdout.strip() not in (tmp_path / "home" / "tokens.json").read_text()
    bad = s("token", "create", "bob", "--role", "god")
    assert bad.returncode == 2 and "unknown role 'god'" in bad.stderr
    bad = s("token", "create", "bob", "--may-pause", "nightly")
    assert bad.returncode == 2 and "unknown priority class 'nightly'" in bad.stderr
    assert s("token", "create", "alice").returncode == 2
    assert s("token", "revoke", "alice").returncode == 0
    assert s.json("token", "list") == []
