"""A parallel step's plain barrier does not hold its sub-workers: the checkpoint is still a cut.

Each sub-worker stages, says ``staged`` and reads on while the coordinator commits;
the coordinator takes each one's state at that message. These tests make the
commit wait until a sub-worker has really written past the cut (a new staged
part exists that the checkpoint does not name), then kill the coordinator with
SIGKILL right after the commit, before anything is published: the sub-workers
die with it, and the next attempt must publish every record exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakectx import FakeRun, read_jsonl_dir

from segue.data import JsonlSink, Limits, SequenceSource, operator, run_map
from segue.data.coordinator import ParallelMapRun
from segue.data.pool import SubWorkerPool
from segue.data.subworker import Recipe

N = 40_000
EXIT_DONE, EXIT_ERROR = 0, 1


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGUE_HOME", str(tmp_path / "home"))


def square(r: int) -> dict[str, int]:
    time.sleep(0.00005)  # long enough that the run spans a few checkpoints on any machine
    return {"k": r, "v": r * r}


def _durable(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _past_the_cut(out: Path, state: dict[str, Any]) -> list[str]:
    """Staged parts that exist but that ``state`` (the checkpoint) does not name."""
    named = {p["staged"] for s in state["sinks"] if s for p in s["pending"]}
    staging = out / ".segue-staging" / "run1" / "step1"
    return sorted(f"{p.parent.name}/{p.name}" for p in staging.glob("w*/*.jsonl") if p.name not in named)


class CutCtx:
    """The step context of one forked attempt. With ``kill``, its first checkpoint waits
    (bounded) for output past the cut, commits durably, then SIGKILLs this process."""

    def __init__(self, root: Path, out: Path, epoch: int, kill: bool) -> None:
        self.root, self.out, self.kill = root, out, kill
        self.run_id, self.step, self.epoch, self.attempt = "run1", "step1", epoch, epoch
        self.params: dict[str, Any] = {}
        self.next_due = 4000

    def restore(self) -> Any:
        p = self.root / "committed.json"
        return json.loads(p.read_text()) if p.exists() else None

    def checkpoint_due(self, steps: int | None = None) -> bool:
        if steps is not None and steps >= self.next_due:
            self.next_due = steps + 8000
            return True
        return False

    def progress(self, done: float, total: float | None = None) -> None:
        pass

    def checkpoint(self, state: Any, *, position: Any = None, durable: bool = False) -> None:
        assert durable
        if self.kill and not state["done"]:
            deadline = time.monotonic() + 60
            while not (later := _past_the_cut(self.out, state)):
                if time.monotonic() > deadline:
                    raise AssertionError("no sub-worker wrote past the cut while the commit waited")
                time.sleep(0.002)
            _durable(self.root / "read-on", json.dumps(later).encode())
        _durable(self.root / "committed.json", json.dumps(state).encode())
        if self.kill and not state["done"]:
            os.kill(os.getpid(), signal.SIGKILL)  # committed, nothing published


def _attempt(root: Path, out: Path, epoch: int, kill: bool) -> str:
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = EXIT_ERROR
        try:
            src = SequenceSource(list(range(N)), shards=4)
            run_map(CutCtx(root, out, epoch, kill), src, square, JsonlSink(out), read_batch=200,
                    workers=2, allow_pickle=True)
            code = EXIT_DONE
        except BaseException:
            (root / "error.txt").write_text(traceback.format_exc())
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    err = root / "error.txt"
    assert os.WEXITSTATUS(status) == EXIT_DONE, err.read_text() if err.exists() else status
    return "done"


def test_a_kill_after_the_commit_with_output_past_the_cut_keeps_exactly_once(tmp_path: Path) -> None:
    root, out = tmp_path / "run", tmp_path / "out"
    root.mkdir()
    assert _attempt(root, out, 1, kill=True) == "killed by SIGKILL"
    later = json.loads((root / "read-on").read_text())
    assert later, "the fault did not land where it should: nothing was written past the cut"
    committed = json.loads((root / "committed.json").read_text())
    assert not committed["done"] and committed["stats"]["records_in"] < N
    assert read_jsonl_dir(out) == []  # killed before the publish: nothing visible
    assert _attempt(root, out, 2, kill=False) == "done"
    got = read_jsonl_dir(out)
    assert Counter(r["k"] for r in got) == Counter(range(N))
    assert sorted(got, key=lambda r: r["k"]) == [{"k": i, "v": i * i} for i in range(N)]
    assert not list((out / ".segue-staging").rglob("*.jsonl"))


class ScriptedPool(SubWorkerPool):
    """Members that say what the script says, in its order (the seam the coordinator talks through)."""

    def __init__(self, script: list[tuple[int, tuple[Any, ...]]]) -> None:
        self.script, self.sent = list(script), []  # type: list[tuple[int, tuple[Any, ...]]]

    def add(self, index: int, recipe: Any, devices: Any) -> None:
        pass

    def leaving(self, index: int) -> None:
        pass

    def send(self, index: int, message: tuple[Any, ...]) -> None:
        self.sent.append((index, message))

    def recv(self, timeout: float) -> list[tuple[int, tuple[Any, ...]]]:
        # Two messages at a time, as one read of both pipes returns them.
        out, self.script = self.script[:2], self.script[2:]
        return out

    def remove(self, index: int) -> None:
        pass

    def stop(self) -> None:
        pass


def test_the_checkpoint_holds_each_sub_workers_state_as_of_its_staged_message(tmp_path: Path) -> None:
    def tick(at: int, n: int) -> tuple[Any, ...]:  # n records since the last tick, now at index ``at``
        return ("tick", {"index": at, "records": at}, n, n, 0, 0, "")

    run = FakeRun()
    sink = {"next_part": 1, "pending": []}
    pool = ScriptedPool([
        (0, tick(10, 10)), (0, ("staged", sink, sink)),
        (0, tick(30, 20)),  # sub-worker 0 reads on past its cut: 20 more records
        (0, ("idle",)),  # and even finishes its shard, before sub-worker 1 has staged
        (1, tick(55, 5)), (1, ("staged", sink, sink)),
    ])
    c = ParallelMapRun(run.attempt(), SequenceSource(list(range(100)), shards=2), operator("map", square),
                       JsonlSink(tmp_path / "out"), JsonlSink(tmp_path / "dead"), Limits(), "fail", 10,
                       workers=2, min_split=None, recipe=Recipe("run1", "step1", 1, 10), pool=pool)
    c._restore()
    for i in (0, 1):
        c._give(i, c.source.shard_from_json(c.queue.pop(0)))
        c.live[i] = None
    c._barrier()
    saved = run.state
    assert [s["position"]["index"] for s in saved["slots"]] == [10, 55]  # the cut, not 30
    assert saved["slots"][0]["shard"] is not None  # its "idle" came after the cut
    assert saved["stats"]["records_in"] == 15
    # The barrier did not hold them; after the commit, what came past the cut counts.
    assert ((0, ("barrier", False)) in pool.sent) and ((1, ("barrier", False)) in pool.sent)
    assert c.stats["records_in"] == 35 and c.idle[0] and c.slots[0].shard is None
    assert [m for _, m in pool.sent if m[0] == "publish"] == [("publish", None, None)] * 2
