"""Server-Sent Events of `segue server`: the progress stream and the event stream end when the run rests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from segue_helpers import FLOWS, Segue, wait_for  # noqa: E402

from segue.home import Home  # noqa: E402
from segue.server import create_app  # noqa: E402

COUNTER = str(FLOWS / "counter.py")


def _frames(text: str) -> list[tuple[str, object]]:
    out = []
    for block in text.split("\n\n"):
        kind = next((x[6:].strip() for x in block.splitlines() if x.startswith("event:")), None)
        data = next((x[5:].strip() for x in block.splitlines() if x.startswith("data:")), None)
        if kind and data is not None:
            out.append((kind, json.loads(data)))
    return out


def test_progress_and_events_stream_until_the_run_rests(segue: Segue, tmp_path: Path, _test_pool: Path) -> None:
    gate = tmp_path / "gate"
    assert segue("run", COUNTER, "--run-id", "s1", "-p", "n=30", "-p", "sleep=0", "-p", f"hold={gate}",
                 "--detach").returncode == 0
    wait_for(lambda: segue.step("s1", "count")["last_checkpoint"], what="a checkpoint")
    home = Home.resolve(segue.home)
    with TestClient(create_app(home, pool=_test_pool, auth=False), base_url="http://127.0.0.1") as api:
        gate.touch()  # the run finishes while the stream is open
        r = api.get("/api/runs/s1/progress?poll_s=0.1")
        frames = _frames(r.text)
        assert r.headers["content-type"].startswith("text/event-stream")
        states = [d["state"] for k, d in frames if k == "status"]  # type: ignore[index]
        assert states[-1] == "SUCCEEDED" and len(states) >= 2
        assert frames[-1][0] == "end"
        r = api.get("/api/runs/s1/events?follow=true", headers={"Last-Event-ID": "3"})
        ids = [d["id"] for k, d in _frames(r.text) if k == "event"]  # type: ignore[index]
        assert ids and ids[0] == 4 and ids == sorted(ids)
        assert api.get("/api/runs/nope/progress").status_code == 404
