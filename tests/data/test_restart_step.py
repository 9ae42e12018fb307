"""Every checkpoint of a data step corrupt: resumes refuse until `--restart-step`, which never duplicates.

Through the real CLI with real runs: the step parks with output published,
every committed checkpoint is then corrupted, and

* the first resume fails (the checkpoints are quarantined) with one line
  naming ``--restart-step``;
* a second plain resume is refused the same way (exit 2) and starts nothing:
  before the fix it started from scratch and published every record again
  beside the parts already there;
* ``segue resume RUN --restart-step STEP`` records an event, discards the
  step's checkpoints and its published parts, and the output ends with
  exactly one line per input record.
"""

from __future__ import annotations

import json
from pathlib import Path

from segue_helpers import Segue, wait_for

from segue.data.sinks.owner import published_parts
from segue.home import Home

FLOW = str(Path(__file__).parent / "flows" / "owned_out.py")
N = 3000


def write_input(directory: Path, n: int, files: int = 3) -> Path:
    directory.mkdir(parents=True)
    for f in range(files):
        with open(directory / f"in-{f}.jsonl", "w") as out:
            for i in range(f, n, files):
                out.write(json.dumps({"k": i, "v": f"v{i}"}) + "\n")
    return directory


def output_lines(out: Path) -> list[int]:
    """Every line of every part file on disk (not only the published set): duplicates would show."""
    return [json.loads(line)["k"] for p in sorted(out.glob("part-*.jsonl"))
            for line in p.read_text().splitlines()]


def test_all_checkpoints_corrupt_needs_restart_step_and_never_duplicates(segue: Segue, tmp_path: Path) -> None:
    inp, out, hold = write_input(tmp_path / "in", N), tmp_path / "out", tmp_path / "hold"
    run = "corrupt"
    segue("run", FLOW, "--run-id", run, "--detach", "-p", f"input={inp}", "-p", f"out={out}",
          "-p", f"hold={hold}", "-p", "hold_k=0", check=True)
    # The first record waits for the hold file or a pause: the pause lets it through, the
    # step commits its first unit, publishes it and parks, with the other files still to do.
    wait_for(lambda: (t := segue.step(run, "transform"))["state"] == "RUNNING" and t["pid"], 60,
             "the worker to start")
    assert segue("pause", run, "--wait", "--timeout", "60").returncode == 0
    before = output_lines(out)
    assert 0 < len(before) < N  # parked with output published and work left
    home = Home.resolve(segue.home)
    store = home.open_store()
    cks = store.list_checkpoints(run, "transform")
    assert cks
    for c in cks:
        (home.data_dir / c.path / "MANIFEST.json").write_text("{}")
    hold.write_text("")  # nothing waits any more: a fresh start would run to the end

    first = segue("resume", run)
    assert first.returncode == 1
    err = segue.step(run, "transform")["error"]
    assert "\n" not in err and f"segue resume {run} --restart-step transform" in err
    assert {c.status for c in store.list_checkpoints(run, "transform", statuses=("committed", "quarantined"))} \
        == {"quarantined"}

    second = segue("resume", run)
    assert second.returncode == 2
    line = second.stderr.strip()
    assert "\n" not in line and line.startswith("segue: step 'transform' of run 'corrupt': none of its ")
    assert f"`segue resume {run} --restart-step transform`" in line
    assert output_lines(out) == before  # refused before anything ran
    assert segue.status(run)["state"] == "FAILED"

    third = segue("resume", run, "--restart-step", "transform")
    assert third.returncode == 0, third.stderr
    got = output_lines(out)
    assert len(got) == N and sorted(got) == list(range(N))
    assert len(published_parts(str(out)) or []) == len(list(out.glob("part-*.jsonl")))
    restarts = [e for e in segue.events(run) if e["kind"] == "restart-step"]
    assert len(restarts) == 1 and restarts[0]["step"] == "transform"


def test_restart_step_is_checked_before_anything_is_written(segue: Segue, tmp_path: Path) -> None:
    inp, out = write_input(tmp_path / "in", 30), tmp_path / "out"
    segue("run", FLOW, "--run-id", "r", "-p", f"input={inp}", "-p", f"out={out}", check=True)
    events = len(segue.events("r"))
    proc = segue("resume", "r", "--restart-step", "nope")
    assert proc.returncode == 2
    assert len(segue.events("r")) == events


def test_restore_refuses_when_every_checkpoint_it_ever_committed_is_quarantined(tmp_path: Path) -> None:
    """The root cause, below the CLI: an auto-resume (scheduler) goes through restore, not `segue resume`."""
    import pytest

    from segue.errors import NoValidCheckpointError
    from segue.run import ops, restart
    from segue.run.context import Flags, StepContext
    from segue.states import Actor, TaskState

    home = Home.resolve(tmp_path / "home")
    store = home.open_store()
    prepared = ops.prepare_run(FLOW, {"input": str(tmp_path), "out": str(tmp_path / "out")}, run_id="q")
    ops.create_run(store, prepared)
    spec = prepared.loaded.flow.steps["transform"]

    def attempt() -> StepContext:
        task = store.start_attempt("q", "transform", ttl_s=60, actor=Actor.CONTROLLER)
        return StepContext(run_id="q", spec=spec, params=prepared.params, epoch=task.epoch,
                           attempt=task.attempts, store=store, storage=home.storage(), flags=Flags(),
                           load_input=lambda name: None, code_fingerprint="x", home=home)

    def end(ctx: StepContext) -> None:
        store.transition_task("q", "transform", TaskState.RETRYING, actor=Actor.CONTROLLER,
                              epoch=ctx.epoch, reason="test", next_attempt_at=0.0)

    ctx = attempt()
    assert ctx.restore() is None
    for i in range(3):
        ctx.checkpoint({"i": i}, durable=True)
    ctx.close()
    end(ctx)
    for c in store.list_checkpoints("q", "transform"):
        store.set_checkpoint_status("q", "transform", c.seq, "quarantined", actor=Actor.WORKER, reason="test")
    for _ in range(2):  # every attempt refuses, not only the one that quarantined them
        ctx = attempt()
        with pytest.raises(NoValidCheckpointError, match=r"none of its 3 committed checkpoints verifies "
                                                         r"\(all were quarantined earlier\).*"
                                                         r"--restart-step transform"):
            ctx.restore()
        end(ctx)
    restart.restart_step(store, "q", "transform")
    ctx = attempt()
    assert ctx.restore() is None  # explicitly started over
    ctx.checkpoint({"i": 0}, durable=True)
    ctx.close()
    assert [c.seq for c in store.list_checkpoints("q", "transform")] == [4]
