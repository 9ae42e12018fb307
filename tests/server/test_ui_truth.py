"""The run page shows what happened: reported progress, not positions; old errors as history.

Real runs through the CLI, the real app through FastAPI's TestClient; waits
gate on what the store shows, never on sleeps.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
from fastapi.testclient import TestClient  # noqa: E402
from segue_helpers import FLOWS, Segue, wait_for  # noqa: E402

from segue.client.local import LocalClient  # noqa: E402
from segue.home import Home  # noqa: E402
from segue.server.auth import Principal, Role  # noqa: E402
from segue.server.ui import views  # noqa: E402

COUNTER, EPOCHS = str(FLOWS / "counter.py"), str(FLOWS / "epochs.py")


def _login(c: TestClient, token: str) -> None:
    c.cookies.set("segue_token", token)


def _values(points: str) -> list[float]:
    """The y coordinates of an SVG polyline: smaller is a larger value."""
    return [float(p.split(",")[1]) for p in points.split()]


def _step_row(html: str, step: str) -> str:
    start = html.index(f'<tr id="step-{step}"')
    return html[start:html.index("</tr>", start)]


def test_progress_chart_plots_reported_progress_not_the_position(segue: Segue, home: Home,
                                                                  _test_pool: Path) -> None:
    """3 epochs of 30 batches: the position's batch restarts every epoch, the progress
    (ctx.progress) climbs to 90 of 90."""
    segue("run", EPOCHS, "--run-id", "ep1", check=True)
    assert segue.status("ep1")["state"] == "SUCCEEDED"
    page = views.run_page(LocalClient(home, pool=_test_pool), Principal("v", Role.VIEWER), "ep1")
    charts = {c.title: c for c in next(c for c in page.charts if c.step == "train").charts}
    progress = charts["progress"]
    ys = _values(progress.points)
    assert ys == sorted(ys, reverse=True), progress.points  # never falls back at an epoch's start
    assert progress.ymax == progress.last > 30  # past one epoch's batches
    backlog = charts["backlog"]
    assert backlog.last == 90 - progress.last
    assert _values(backlog.points) == sorted(_values(backlog.points)), backlog.points  # only shrinks
    commits = [e for e in segue.events("ep1") if e["kind"] == "checkpoint" and e["to_state"] is None]
    assert len(commits) >= 20 and progress.last == commits[-1]["data"]["progress"]["done"]
    for e in commits:  # each commit records the progress the step reported by then
        pos, prog = e["data"]["position"], e["data"]["progress"]
        assert prog["total"] == 90 and prog["done"] >= pos["epoch"] * 30 + pos["batch"], e["data"]


def test_errors_of_earlier_attempts_are_history(api: TestClient, tokens: dict[str, str], segue: Segue,
                                                tmp_path: Path) -> None:
    gate = tmp_path / "release"
    segue("run", COUNTER, "--run-id", "old1", "-p", "n=40", "-p", "sleep=0.005", "-p", f"hold={gate}",
          "--detach", check=True)
    first = wait_for(lambda: (s := segue.step("old1", "count"))["last_checkpoint"] and s["pid"] and s,
                     120, "a first checkpoint")
    os.kill(first["pid"], signal.SIGKILL)
    second = wait_for(lambda: (s := segue.step("old1", "count"))["attempts"] == 2 and s["state"] == "RUNNING"
                      and s["pid"] and s, 120, "attempt 2 running")
    # Running again: the SIGKILL is attempt 1's, not this attempt's error.
    assert second["error"] is None, second
    assert second["earlier_errors"][-1]["attempt"] == 1
    assert second["earlier_errors"][-1]["error"] == "worker process was killed by SIGKILL"
    text = segue("status", "old1").stdout
    assert "error: worker process was killed" not in text, text
    assert "earlier: attempt 1 failed: worker process was killed by SIGKILL" in text, text

    gate.touch()
    segue.wait_state("old1", {"SUCCEEDED"}, 120)
    done = segue.step("old1", "count")
    assert done["error"] is None and [e["attempt"] for e in done["earlier_errors"]] == [1]
    _login(api, tokens["viewer"])
    row = _step_row(api.get("/runs/old1?step=count").text, "count")
    assert 'class="error"' not in row, row  # nothing in red on a step that succeeded
    assert "earlier: attempt 1: worker process was killed by SIGKILL" in row, row


def test_a_current_error_stays_the_steps_error(segue: Segue, tmp_path: Path) -> None:
    """A step that failed for good keeps its error; its retries' errors are history."""
    marker = tmp_path / "fail"
    marker.write_text("x")
    proc = segue("run", COUNTER, "--run-id", "bad1", "-p", "n=40", "-p", f"fail_marker={marker}",
                 env={"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.02"})
    assert proc.returncode == 1, proc.stderr
    step = segue.step("bad1", "count")
    assert step["state"] == "FAILED" and step["error"] == "RuntimeError: fail marker present"
    # The newest five of its 20 retried failures, each an earlier attempt's.
    assert [e["attempt"] for e in step["earlier_errors"]] == [16, 17, 18, 19, 20]
    assert "attempt 21 failed: RuntimeError: fail marker present" in segue("status", "bad1").stdout
