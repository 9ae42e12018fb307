"""``ctx.log_metrics`` with real processes: a step logging every step is SIGKILLed past its
last checkpoint (once its points there are seen in the store), retried from that
checkpoint, and ends with exactly one point per step, the uninterrupted run's values;
the CLI, the API, /metrics, the run page and TensorBoard's event files all show it so.
"""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from segue_helpers import FLOWS, Segue, flow_module, wait_for

from segue.home import Home
from segue.run.metrics import MetricsBuffer, check_points
from segue.store import Store

FLOW = str(FLOWS / "metrics_train.py")
QUICK_RETRY = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
N, HOLD_AT, CKPT_AT = 30, 12, 10  # checkpoints every 5 steps: the newest before the hold is at 10


def killed_and_resumed(segue: Segue, run: str) -> tuple[Store, int, int]:
    """Run the flow, SIGKILL its first attempt while it holds at step HOLD_AT (its points
    up to there stored, its checkpoint at CKPT_AT committed), and let the retry finish.
    Returns the store and the two attempts' epochs."""
    segue("run", FLOW, "--run-id", run, "--detach", "-p", f"n={N}", "-p", f"hold_at={HOLD_AT}",
          env=QUICK_RETRY, check=True)
    store = Home.resolve(segue.home).open_store()
    wait_for(lambda: any(p.name == "loss" and p.index == HOLD_AT for p in store.get_metrics(run)),
             120, "the first attempt's points up to the hold (flushed by its heartbeat)")
    wait_for(lambda: any(c.position == {"i": CKPT_AT} for c in store.list_checkpoints(run, "train")),
             60, f"the checkpoint at step {CKPT_AT}")
    task = store.get_task(run, "train")
    assert task.pid is not None and task.attempts == 1
    os.kill(task.pid, signal.SIGKILL)  # the first attempt holds until killed: this cannot miss
    assert segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 180)["state"] == "SUCCEEDED"
    final = store.get_task(run, "train")
    assert final.attempts == 2
    return store, task.epoch, final.epoch


def test_metrics_survive_a_sigkill_once_per_step(segue: Segue, _test_pool: Path) -> None:
    run = "m1"
    store, e1, e2 = killed_and_resumed(segue, run)
    want = flow_module("metrics_train").expected(N)

    points = store.get_metrics(run)
    loss = [p for p in points if p.name == "loss"]
    lr = [p for p in points if p.name == "lr"]
    assert len(points) == 2 * N  # one point per (metric, step): the redone 10..12 replaced
    assert [p.index for p in loss] == [p.index for p in lr] == list(range(N))
    assert [p.value for p in loss] == [w[1] for w in want]  # exact; step 3's NaN stored as null
    assert [p.value for p in lr] == [w[2] for w in want]
    # Steps 10..12 were logged by both attempts; the store keeps the retry's.
    assert [p.epoch for p in loss] == [e1] * CKPT_AT + [e2] * (N - CKPT_AT)

    # The CLI, a thin shell over Client.metrics.
    proc = segue("metrics", run)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "train:" and lines[1].split() == ["step", "loss", "lr"]
    assert lines[2 + 3].split() == ["3", "nan", f"{want[3][2]:.6g}"]
    assert lines[2 + N - 1].split() == [str(N - 1), f"{want[-1][1]:.6g}", f"{want[-1][2]:.6g}"]
    assert len(lines) == 2 + N
    doc = json.loads(segue("metrics", run, "--step", "train", "--json").stdout)
    assert [(d["name"], d["index"], d["value"], d["epoch"]) for d in doc] == [
        (p.name, p.index, p.value, p.epoch) for p in points]
    bad = segue("metrics", run, "--step", "nope")
    assert bad.returncode == 2 and bad.stderr == "segue: run 'm1' has no step 'nope'; its steps: train\n"

    _served(segue, _test_pool, run, points, want)


def _served(segue: Segue, pool: Path, run: str, points: list[Any], want: list[Any]) -> None:
    """The API route, the /metrics gauge and the run page, from a server on loopback."""
    pytest.importorskip("fastapi", reason="the server extra (fastapi) is not installed")
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    from server_helpers import serving

    from segue.server import create_app
    from segue.server.auth import Role, TokenStore

    home = Home.resolve(segue.home)
    token = TokenStore(home).create("viewer", Role.VIEWER)
    auth = {"Authorization": f"Bearer {token}"}
    with serving(create_app(home, pool=pool)) as base:
        assert httpx.get(f"{base}/api/runs/{run}/metrics").status_code == 401
        got = httpx.get(f"{base}/api/runs/{run}/metrics", headers=auth, params={"step": "train"})
        assert got.status_code == 200, got.text
        assert got.json() == [{"run_id": p.run_id, "step": p.step, "name": p.name, "index": p.index,
                               "value": p.value, "epoch": p.epoch, "time": p.time} for p in points]
        later = httpx.get(f"{base}/api/runs/{run}/metrics", headers=auth,
                          params={"since": max(p.time for p in points)})
        assert later.json() == []
        assert httpx.get(f"{base}/api/runs/{run}/metrics", headers=auth,
                         params={"step": "../x"}).status_code == 400

        text = httpx.get(f"{base}/metrics", headers=auth).text
        gauges = {s.labels["metric"]: s.value for fam in text_string_to_metric_families(text)
                  for s in fam.samples if s.name == "segue_step_metric"}
        assert gauges == {"loss": want[-1][1], "lr": want[-1][2]}
        assert 'segue_step_metric{flow="metrics_train",metric="loss",step="train"}' in text
        assert "run_id" not in text

        page = httpx.get(f"{base}/runs/{run}", cookies={"segue_token": token}).text
        assert page.count('class="chart metric-chart"') == 2
        assert page.count("attempt 2 resumed at step 10") == 2  # one mark per chart


def test_tensorboard_event_files_hold_each_step_once(segue: Segue, _test_pool: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'segue[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    killed_and_resumed(segue, "tb1")
    logdir = segue.home / "logs" / "tb1" / "tensorboard" / "train"
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2  # one file per attempt
    acc = EventAccumulator(str(logdir))
    acc.Reload()  # the retry's restart at step 10 drops the first attempt's 10..12
    want = flow_module("metrics_train").expected(N)
    loss = acc.Scalars("loss")
    assert [s.step for s in loss] == list(range(N))
    assert math.isnan(loss[3].value)
    assert [s.value for i, s in enumerate(loss) if i != 3] == [
        float(np.float32(w[1])) for w in want if w[0] != 3]


# -- in one process: the arguments and the buffer ---------------------------------------------
@pytest.mark.parametrize(("step", "values", "message"), [
    (1.0, {"loss": 1.0}, r"^log_metrics: step must be an integer \(the step's own counter\), not float$"),
    (-1, {"loss": 1.0}, r"^log_metrics: step must be from 0 to 9223372036854775807, not -1$"),
    (0, {}, r"^log_metrics: give at least one value, e\.g\. log_metrics\(step=i, loss=loss\)$"),
    (0, {"a b": 1.0}, r"^log_metrics: metric name 'a b' must be a letter or '_' then up to 63 "
                      r"letters, digits or '_'$"),
    (0, {"x" * 65: 1.0}, r"^log_metrics: metric name 'x{65}' must be"),
    (0, {"loss": "0.5"}, r"^log_metrics: metric 'loss' must be a number, not str$"),
    (0, {"loss": [1.0]}, r"^log_metrics: metric 'loss' must be a number, not list$"),
])
def test_bad_arguments_are_one_line(step: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_points(step, values)


def test_values_nan_and_infinities_become_null() -> None:
    assert check_points(np.int64(4), {"a": np.float32(0.5), "b": math.nan, "c": -math.inf, "d": 2}) == [
        ("a", 4, 0.5), ("b", 4, None), ("c", 4, None), ("d", 4, 2.0)]


def test_a_failed_flush_keeps_its_points_and_newer_ones_win() -> None:
    buf = MetricsBuffer()
    buf.add([("loss", 0, 1.0), ("loss", 1, 2.0)])

    def refuse(points: list[Any]) -> None:
        buf.add([("loss", 1, 5.0), ("lr", 1, 0.1)])  # logged while the write is in flight
        raise OSError("store busy")

    with pytest.raises(OSError):
        buf.flush(refuse)
    written: list[list[Any]] = []
    assert buf.flush(written.append) == 3
    assert written == [[("loss", 0, 1.0), ("loss", 1, 5.0), ("lr", 1, 0.1)]]
    assert buf.flush(written.append) == 0 and len(written) == 1
