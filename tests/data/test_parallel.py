"""run_map(workers=N): sub-worker processes, the checkpoint barrier, rebalancing by splits."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest
from fakectx import Crash, FakeRun, read_jsonl_dir

from segue.data import JsonlSink, SequenceSource, run_map
from segue.run.context import Park

N = 3000


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGUE_HOME", str(tmp_path / "home"))


def double(r: int) -> dict[str, int]:
    return {"k": r, "v": 2 * r}


def slow_low(r: int) -> dict[str, int]:
    if r < N // 2:
        time.sleep(0.0005)  # the first shard lags: the other worker goes idle early
    return {"k": r, "v": 2 * r}


def _keys(out: Path) -> Counter[int]:
    return Counter(r["k"] for r in read_jsonl_dir(out))


def test_three_workers_write_what_one_writes(tmp_path: Path) -> None:
    src = SequenceSource(list(range(N)), shards=7)
    run_map(FakeRun().attempt(), src, double, JsonlSink(tmp_path / "one"), read_batch=100)
    run = FakeRun()
    res = run_map(run.attempt(), src, double, JsonlSink(tmp_path / "three"), read_batch=100, workers=3,
                  allow_pickle=True)
    assert sorted(read_jsonl_dir(tmp_path / "three"), key=str) == sorted(read_jsonl_dir(tmp_path / "one"), key=str)
    assert res["records_in"] == N and res["records_out"] == N
    assert run.state["done"] and run.positions[-1]["workers"] == 3
    assert not list((tmp_path / "three" / ".segue-staging").rglob("*.jsonl"))


def test_a_lagging_shard_is_split_and_the_split_committed(tmp_path: Path) -> None:
    run = FakeRun()
    src = SequenceSource(list(range(N)), shards=2)
    run_map(run.attempt(), src, slow_low, JsonlSink(tmp_path / "out"), read_batch=50, workers=2, min_split=100,
            allow_pickle=True)
    assert run.positions[-1]["splits"] >= 1, run.positions[-1]
    assert run.state["splits"] >= 1
    assert _keys(tmp_path / "out") == Counter(range(N))


def test_crashes_and_pauses_keep_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(7)
    run = FakeRun()
    src = SequenceSource(list(range(N)), shards=5)
    faults = 0
    for _ in range(30):
        mode = rng.choice(["before", "after", "pause"] + ([None] if faults >= 4 else []))
        ctx = run.attempt(rng=rng, every=2, crash=mode if mode in ("before", "after") else None,
                          crash_after=rng.randint(0, 3), pause_after=rng.randint(0, 3) if mode == "pause" else None)
        try:
            run_map(ctx, src, slow_low, JsonlSink(tmp_path / "out"), read_batch=50, workers=2, min_split=100,
            allow_pickle=True)
            break
        except (Crash, Park):
            faults += 1
    else:
        raise AssertionError("never finished")
    assert faults >= 3
    assert _keys(tmp_path / "out") == Counter(range(N))


def test_unpicklable_function_is_refused_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^run_map\(workers=2\) sends fn, source and sinks to sub-worker "
                                         r"processes, but they do not pickle"):
        run_map(FakeRun().attempt(), SequenceSource([1, 2]), lambda r: r, JsonlSink(tmp_path / "o"), workers=2,
                allow_pickle=True)


def test_direct_parallel_call_needs_pickle_opt_in(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^run_map\(workers=2\) called directly would send fn, source and "
                                         r"sinks to the sub-workers with pickle; pass allow_pickle=True"):
        run_map(FakeRun().attempt(), SequenceSource([1, 2]), double, JsonlSink(tmp_path / "o"), workers=2)


def test_a_sink_without_worker_support_is_refused(tmp_path: Path) -> None:
    from segue.data import SqlSink

    with pytest.raises(ValueError, match=r"^SqlSink cannot be written by parallel sub-workers"):
        run_map(FakeRun().attempt(), SequenceSource([1, 2]), double,
                SqlSink(f"sqlite:///{tmp_path / 'o.db'}", "t", ["k", "v"]), workers=2)


# -- real processes, through the CLI ---------------------------------------------------

FLOW = str(Path(__file__).parent / "flows" / "mapparallel.py")


def _subworkers(pid: int) -> list[int]:
    """The sub-worker processes among the children of the step's worker process: all of
    them but multiprocessing's resource tracker, which comes with spawned (cold) ones;
    warmed ones are forked copies of the worker, with its command line."""
    import glob

    kids: list[int] = []
    for f in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            kids.extend(int(x) for x in Path(f).read_text().split())
        except OSError:
            pass
    out = []
    for k in kids:
        try:
            if b"resource_tracker" not in Path(f"/proc/{k}/cmdline").read_bytes():
                out.append(k)
        except OSError:
            pass
    return out


def test_cli_kills_of_coordinator_subworker_and_controller_keep_exactly_once(segue, tmp_path: Path) -> None:
    """A sub-worker (once its attempt committed), then the coordinator (the step's worker)
    and the controller of new attempts, each SIGKILLed; every kill is counted only if it
    landed."""
    import os
    import signal

    from segue_helpers import wait_for
    from test_kill_campaign import FAST, check_exactly_once, make_input, read_output

    from segue._procs import pid_alive, wait_dead
    from segue.home import Home

    n = 8000
    inp = make_input(tmp_path / "in", n)
    segue.env.update(FAST)
    clean_out = tmp_path / "clean"
    proc = segue("run", FLOW, "--run-id", "clean", "-p", f"input={inp}", "-p", f"out={clean_out}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    clean = read_output("jsonl", clean_out)
    check_exactly_once(clean, n)

    hold = tmp_path / "hold"  # the last record waits for it: the run cannot end before the kills
    # Slower records (8 s a pass): the first attempt must commit before it reaches the held
    # record, where it can no longer checkpoint, however starved this test is.
    segue.env.update({"MAPPARALLEL_HOLD": str(hold), "MAPPARALLEL_HOLD_K": str(n - 1),
                      "MAPPARALLEL_WORK_S": "0.004"})
    out = tmp_path / "out"
    segue("run", FLOW, "--run-id", "faulty", "-p", f"input={inp}", "-p", f"out={out}", "--detach", check=True)
    store = Home.resolve(segue.home).open_store()

    def committed_in_current_attempt():
        t = store.get_tasks("faulty")[0]
        cks = store.list_checkpoints("faulty", t.step)
        ok = t.state.value == "RUNNING" and pid_alive(t.pid) and cks and cks[0].epoch == t.epoch
        return t if ok else None

    def land(pid: int) -> bool:
        if not pid_alive(pid):
            return False
        os.kill(pid, signal.SIGKILL)
        assert wait_dead(pid, 30), f"pid {pid} survived SIGKILL"
        return True

    landed = []
    t = wait_for(committed_in_current_attempt, 120, "a checkpoint of the first attempt")
    subs = wait_for(lambda: _subworkers(t.pid), 60, "the sub-workers")
    if land(subs[0]):
        landed.append(("sub-worker", t.epoch))
    def running_in_new_attempt(prev: int):  # restored, its sub-workers at work
        t = store.get_tasks("faulty")[0]
        ok = t.state.value == "RUNNING" and t.epoch > prev and pid_alive(t.pid) and _subworkers(t.pid)
        return t if ok else None

    for target in ("coordinator", "controller"):
        # Not "once it committed": a new attempt may be handed the held record's shard
        # first, and then cannot reach a barrier until the hold opens.
        prev = t.epoch
        t = wait_for(lambda: running_in_new_attempt(prev), 120, f"a new attempt before killing the {target}")
        pid = t.pid if target == "coordinator" else store.get_run("faulty").controller_pid
        if land(pid):
            landed.append((target, t.epoch))
    assert [w for w, _ in landed] == ["sub-worker", "coordinator", "controller"], landed
    assert segue("resume", "faulty", "--detach").returncode == 0  # the controller died: take over
    hold.write_text("go")
    segue.wait_state("faulty", {"SUCCEEDED"}, 300)
    check_exactly_once(read_output("jsonl", out), n, clean)
    # The store saw the coordinator's death as a failed attempt (the controller's own kill
    # took its attempt with it): at least the two worker-side kills cost an attempt each.
    assert store.get_tasks("faulty")[0].epoch >= landed[-1][1] + 1
