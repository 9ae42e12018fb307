"""Paths chosen at run time (fan-out, branch, bounded loop), with real processes and SIGKILLs.

Every test compares the join's output with what an uninterrupted run returns, checks
that the decision events precede the tasks they create or choose, and that no task
committed its output twice.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import FLOWS, Segue, flow_module, wait_for

PATHS = str(FLOWS / "paths.py")
expected = flow_module("paths").expected


def committed(segue: Segue, run_id: str) -> Counter[str]:
    """How many times each task committed its output."""
    return Counter(e["step"] for e in segue.events(run_id)
                   if e["kind"] == "task" and e["to_state"] == "SUCCEEDED")


def decisions(segue: Segue, run_id: str) -> list[dict[str, Any]]:
    return [e for e in segue.events(run_id) if e["kind"] == "decision"]


def assert_path(segue: Segue, run_id: str, *, n: int, prefer: str) -> None:
    st = segue.status(run_id)
    assert st["state"] == "SUCCEEDED", st
    assert segue.output(run_id, "join") == expected(n, prefer)
    steps = {s["name"]: s for s in st["steps"]}
    fast = expected(n, prefer)["fast"] is not None
    assert steps["fast_path"]["state"] == ("SUCCEEDED" if fast else "SKIPPED")
    assert steps["slow_path"]["state"] == ("SKIPPED" if fast else "SUCCEEDED")
    assert steps["rescore"]["state"] == ("SKIPPED" if fast else "SUCCEEDED")
    assert steps["score"]["items"]["states"] == {"SUCCEEDED": n}
    # Only the tasks of the path taken ran, each committed once.
    done = committed(segue, run_id)
    assert max(done.values()) == 1, done
    items = {f"score.{i}" for i in range(n)}
    loop = set() if fast else {f"rescore.{i}" for i in range(expected(n, prefer)["rescore"]["iteration"] + 1)}
    ran = {"list_shards", "score", "route", "join", *items, *loop,
           *(("fast_path",) if fast else ("slow_path", "rescore"))}
    assert set(done) == ran
    # One decision per choice, each stored before the first task it made or chose started.
    evs = segue.events(run_id)
    kinds = Counter((e["step"], e["data"].get("kind")) for e in evs if e["kind"] == "decision")
    assert kinds[("score", "foreach")] == 1 and kinds[("route", "branch")] == 1
    assert kinds[("rescore", "loop")] == (0 if fast else len(loop))

    def first(pred: Any) -> int:
        return next(i for i, e in enumerate(evs) if pred(e))

    started = lambda step: first(lambda e: e["step"] == step and e["to_state"] == "RUNNING")  # noqa: E731
    assert first(lambda e: e["kind"] == "decision" and e["step"] == "score") < started("score.0")
    chosen = "fast_path" if fast else "slow_path"
    assert first(lambda e: e["kind"] == "decision" and e["step"] == "route") < started(chosen)


@pytest.mark.parametrize("prefer", ["fast", "slow"])
def test_a_clean_run_takes_the_chosen_path(segue: Segue, prefer: str) -> None:
    proc = segue("run", PATHS, "--run-id", "p", "-p", "n=5", "-p", f"prefer={prefer}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert_path(segue, "p", n=5, prefer=prefer)
    # A branch decision is one event naming what was chosen and what was skipped.
    route = next(d for d in decisions(segue, "p") if d["step"] == "route")
    assert route["data"]["chose"] == [f"{prefer}_path"]
    other = "slow_path" if prefer == "fast" else "fast_path"
    assert other in route["data"]["skipped"]
    assert ("rescore" in route["data"]["skipped"]) == (prefer == "fast")


def test_an_empty_fan_out_succeeds_with_an_empty_list(segue: Segue) -> None:
    proc = segue("run", PATHS, "--run-id", "e", "-p", "n=0", "-p", "prefer=slow", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert segue.output("e", "score") == []
    assert segue.output("e", "route") == {"mean": 0.0, "n": 0}


# The controller's decisions, in the order this flow makes them with prefer=slow:
# 1 the fan-out (after list_shards committed, before any item exists), 2 the branch,
# 3.. the loop's iterations 0, 1, 2.
@pytest.mark.parametrize("point,hit", [
    ("controller.before_decision", 1),  # the parent's list committed, no item created yet
    ("controller.after_decision", 1),  # items created, none started
    ("controller.before_decision", 2),  # route chose, nothing recorded
    ("controller.after_decision", 2),  # the choice recorded, the chosen step not started
    ("controller.after_decision", 4),  # the loop's iteration 1 created, not started
])
def test_a_controller_killed_at_a_decision_resumes_on_the_same_path(segue: Segue, point: str, hit: int) -> None:
    env = {"SEGUE_FAULTS": f"{point}:kill:{hit}", "SEGUE_FAULTS_IN": "controller"}
    proc = segue("run", PATHS, "--run-id", "k", "-p", "n=4", "-p", "prefer=slow", env=env, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    before = decisions(segue, "k")
    assert len(before) == (hit - 1 if point.endswith("before_decision") else hit)  # the kill landed there
    proc = segue("resume", "k", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert_path(segue, "k", n=4, prefer="slow")
    # What was decided before the kill was not decided again.
    after = decisions(segue, "k")
    assert after[: len(before)] == before


def test_killed_items_resume_and_finished_ones_never_run_again(segue: Segue, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    for i in (0, 1):
        (hold / f"go-{i}").touch()
    run = segue.popen("run", PATHS, "--run-id", "i", "-p", "n=5", "-p", "prefer=fast", "-p", f"hold={hold}")
    try:
        def items() -> dict[str, str]:
            st = segue.status("i") if segue("status", "i").returncode == 0 else {"steps": []}
            score = next((s for s in st["steps"] if s["name"] == "score"), None)
            kids = segue.json("status", "i", "--items")["steps"] if score and score.get("items") else []
            return {k["name"]: k["state"] for s in kids if s["name"] == "score" for k in s["items"]["tasks"]}

        # Items 0 and 1 done, and another one running (held): kill the controller now.
        wait_for(lambda: (lambda st: st.get("score.0") == st.get("score.1") == "SUCCEEDED"
                          and "RUNNING" in st.values())(items()), 180, "two items done and a third running")
        run.send_signal(signal.SIGKILL)
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate(timeout=60)  # reaped, its pipes closed
    for i in range(5):
        (hold / f"go-{i}").touch()
    proc = segue("resume", "i", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert_path(segue, "i", n=5, prefer="fast")
    kids = {k["name"]: k for s in segue.json("status", "i", "--items")["steps"] if s["name"] == "score"
            for k in s["items"]["tasks"]}
    assert kids["score.0"]["attempts"] == kids["score.1"]["attempts"] == 1  # never run again
    assert any(k["attempts"] == 2 for k in kids.values()), kids  # the killed one ran again
    assert sorted(os.listdir(hold)).count("started-0") == 1


def test_a_parent_that_returns_no_list_fails_the_run_with_why(segue: Segue, tmp_path: Path) -> None:
    flow = tmp_path / "notalist.py"
    flow.write_text(
        "from segue import Flow\n"
        "flow = Flow('notalist')\n"
        "@flow.step\n"
        "def parent(ctx):\n"
        "    return {'shards': 3}\n"
        "@flow.foreach(over=parent, key='shards')\n"
        "def child(ctx):\n"
        "    return ctx.item\n")
    proc = segue("run", str(flow), "--run-id", "n", timeout=300)
    assert proc.returncode != 0
    st = segue.status("n")
    assert st["state"] == "FAILED"
    reason = [e for e in segue.events("n") if e["kind"] == "run"][-1]["reason"]
    assert "fans out over parent['shards'], which is a int, not a list" in reason


def test_a_branch_point_that_does_not_choose_fails_without_retries(segue: Segue, tmp_path: Path) -> None:
    flow = tmp_path / "nochoice.py"
    flow.write_text(
        "from segue import Flow\n"
        "flow = Flow('nochoice')\n"
        "@flow.step(choices=['a', 'b'], retries=3)\n"
        "def route(ctx):\n"
        "    return 1\n"
        "@flow.step(after=[route])\n"
        "def a(ctx):\n"
        "    return 'a'\n"
        "@flow.step(after=[route])\n"
        "def b(ctx):\n"
        "    return 'b'\n")
    proc = segue("run", str(flow), "--run-id", "c", timeout=300)
    assert proc.returncode != 0
    route = segue.step("c", "route")
    assert route["state"] == "FAILED" and route["attempts"] == 1
    assert "returned without calling ctx.choose" in route["error"]


@pytest.mark.parametrize("body,message", [
    ("@flow.step(choices=['b'])\ndef a(ctx):\n    pass\n@flow.step\ndef b(ctx):\n    pass\n",
     "'b' does not run right after it"),
    ("@flow.step\ndef a(ctx):\n    return []\n@flow.loop(after=[a], until=3, max_iterations=2)\n"
     "def b(ctx):\n    pass\n", "until must be a function"),
    ("@flow.step\ndef a(ctx):\n    return []\n@flow.loop(after=[a], until=bool, max_iterations=0)\n"
     "def b(ctx):\n    pass\n", "max_iterations must be an int >= 1"),
])
def test_a_bad_path_declaration_is_one_line_exit_2(segue: Segue, tmp_path: Path, body: str, message: str) -> None:
    flow = tmp_path / "bad.py"
    flow.write_text("from segue import Flow\nflow = Flow('bad')\n" + body)
    proc = segue("run", str(flow))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def killed_mid_listing(segue: Segue, tmp_path: Path, run_id: str, *, finish_first: bool) -> tuple[Path, Path]:
    """A listing.py run over three files, its controller (and the items with it) SIGKILLed
    while an item runs; with ``finish_first``, once item 0 succeeded. Returns (data, hold)."""
    data, hold = tmp_path / "data", tmp_path / "hold"
    data.mkdir(), hold.mkdir()
    for i in range(3):
        (data / f"f{i}.txt").write_text("x" * (i + 1))
    run = segue.popen("run", str(FLOWS / "listing.py"), "--run-id", run_id, "-p", f"data={data}", "-p",
                      f"hold={hold}")
    try:
        wait_for(lambda: (hold / "started-0").exists(), 180, "an item to start")
        if finish_first:
            (hold / "go-0").touch()
            wait_for(lambda: segue.json("status", run_id, "--items")["steps"][1]["items"]["states"].get(
                "SUCCEEDED"), 180, "an item to succeed")
        run.send_signal(signal.SIGKILL)
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate(timeout=60)  # reaped, its pipes closed
    return data, hold


def test_resume_refuses_a_fan_out_whose_files_changed_unless_pinned(segue: Segue, tmp_path: Path) -> None:
    data, hold = killed_mid_listing(segue, tmp_path, "l", finish_first=False)
    fanout = next(d for d in decisions(segue, "l") if d["step"] == "measure")
    assert fanout["data"]["items"] == 3 and fanout["data"]["inputs"] == 3
    (data / "f3.txt").write_text("new")  # a file appears while the run is stopped
    (hold / "go").touch()

    proc = segue("resume", "l", timeout=300)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "the fan-out of measure over 3 item(s) of list_files was made from inputs that changed" in line
    assert "f3.txt" in line and "--on-input-change pin" in line
    assert segue.status("l")["state"] == "RUNNING"  # refused: nothing was written

    proc = segue("resume", "l", "--on-input-change", "pin", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert segue.output("l", "total") == [("f0.txt", 1), ("f1.txt", 2), ("f2.txt", 3)]  # the recorded path
    kept = [e for e in segue.events("l") if e["kind"] == "warning" and e["data"].get("kind") == "path-kept"]
    assert len(kept) == 1 and "f3.txt" in kept[0]["reason"]


def test_restart_step_decides_the_fan_out_again_from_the_files_as_they_are(segue: Segue, tmp_path: Path) -> None:
    data, hold = killed_mid_listing(segue, tmp_path, "r", finish_first=True)
    (data / "f1.txt").unlink()
    (data / "f3.txt").write_text("four")
    (hold / "go").touch()
    assert segue("resume", "r", timeout=300).returncode == 2  # the listing changed: refused

    proc = segue("resume", "r", "--restart-step", "list_files", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert segue.output("r", "total") == [("f0.txt", 1), ("f2.txt", 3), ("f3.txt", 4)]  # decided again
    events = segue.events("r")
    restart = next(i for i, e in enumerate(events) if e["kind"] == "restart-path")
    fanouts = [(i, e) for i, e in enumerate(events) if e["kind"] == "decision" and e["step"] == "measure"]
    assert [e["data"]["items"] for _, e in fanouts] == [3, 3]
    assert fanouts[0][0] < restart < fanouts[1][0]  # once before the restart, once after
    assert events[restart]["data"]["reset"] == ["list_files", "measure", "total"]
    # After the restart, every task of the new path committed exactly once.
    after = Counter(e["step"] for e in events[restart:] if e["kind"] == "task" and e["to_state"] == "SUCCEEDED")
    assert set(after) == {"list_files", "measure", "total", "measure.0", "measure.1", "measure.2"}
    assert max(after.values()) == 1


def test_restart_step_of_a_finished_run_is_refused(segue: Segue, tmp_path: Path) -> None:
    flow = tmp_path / "one.py"
    flow.write_text("from segue import Flow\nflow = Flow('one')\n@flow.step\ndef a(ctx):\n    return 1\n")
    assert segue("run", str(flow), "--run-id", "o", timeout=300).returncode == 0
    proc = segue("resume", "o", "--restart-step", "a")
    assert proc.returncode == 2 and "already succeeded" in proc.stderr, proc.stderr


def test_the_triage_example_routes_by_confidence_and_reports(segue: Segue, tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "triage.py"
    proc = segue("run", str(example), "--run-id", "t", "-p", f"data={tmp_path / 'docs'}", "-p",
                 f"out={tmp_path / 'out'}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = segue.output("t", "report")
    assert report["documents"] == 12 and report["unsure"] == 0
    steps = {s["name"]: s["state"] for s in segue.status("t")["steps"]}
    took = report["path"]
    assert steps[took] == "SUCCEEDED" and steps["publish" if took == "rescore" else "rescore"] == "SKIPPED"
    assert (tmp_path / "out" / "report.json").exists()


def test_a_fan_out_over_the_outputs_of_another_fan_out(segue: Segue, tmp_path: Path) -> None:
    flow = tmp_path / "twice.py"
    flow.write_text(
        "from segue import Flow\n"
        "flow = Flow('twice')\n"
        "@flow.step\n"
        "def parent(ctx):\n"
        "    return [1, 2, 3]\n"
        "@flow.foreach(over=parent)\n"
        "def double(ctx):\n"
        "    return [ctx.item] * 2\n"
        "@flow.foreach(over=double)\n"
        "def total(ctx):\n"
        "    return sum(ctx.item) + ctx.index\n"
        "@flow.step(after=[total])\n"
        "def join(ctx):\n"
        "    return ctx.inputs['total']\n")
    proc = segue("run", str(flow), "--run-id", "t2", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert segue.output("t2", "join") == [2, 5, 8]
    total = next(d for d in decisions(segue, "t2") if d["step"] == "total")
    assert total["data"]["items"] == 3 and total["data"]["output_ref"] == "gather:3"
