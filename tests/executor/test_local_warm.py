"""Warmed sub-workers of a local attempt (segue.executor.local_warm): started before the
worker's imports, taken by the pool, released or dead when not needed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from segue.data import JsonlSink, Limits, SequenceSource, operator
from segue.data.coordinator import ParallelMapRun
from segue.data.pool import LocalProcessPool
from segue.executor import local_warm
from segue.executor.base import Launch, warm_members
from segue.flow.model import Resources

sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
from fakectx import FakeRun, read_jsonl_dir  # noqa: E402
from segue_helpers import wait_for  # noqa: E402

N = 2000


def double(r: int) -> dict[str, int]:
    return {"k": r, "v": 2 * r}


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SEGUE_HOME", str(tmp_path / "home"))
    yield
    local_warm.release()  # a failed test leaves none for the next


class RecordingPool(LocalProcessPool):
    """The real local pool, noting which process serves each index."""

    def __init__(self) -> None:
        super().__init__()
        self.served: dict[int, int] = {}

    def add(self, index: int, recipe: Any, devices: tuple[int, ...] | None) -> None:
        super().add(index, recipe, devices)
        self.served[index] = self._procs[index].pid


def _run(tmp_path: Path, pool: LocalProcessPool, workers: int = 2) -> dict[str, Any]:
    c = ParallelMapRun(FakeRun().attempt(), SequenceSource(list(range(N)), shards=4), operator("map", double),
                       JsonlSink(tmp_path / "out"), JsonlSink(tmp_path / "dead"), Limits(), "fail", 100,
                       workers=workers, min_split=None, recipe=None, pool=pool, allow_pickle=True)
    return c.execute()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return b") Z" in f.read()  # a zombie holds nothing and runs nothing
    except FileNotFoundError:
        return True


def test_the_pool_takes_the_warmed_members_and_they_do_the_work(tmp_path: Path) -> None:
    local_warm.warm(2)
    warmed = local_warm.warmed()
    assert sorted(warmed) == [0, 1]
    pool = RecordingPool()
    res = _run(tmp_path, pool)
    assert pool.served == warmed  # no cold start
    assert local_warm.warmed() == {}
    assert res["records_in"] == N
    assert Counter(r["k"] for r in read_jsonl_dir(tmp_path / "out")) == Counter(range(N))


def test_members_the_step_does_not_need_are_released_with_the_pool(tmp_path: Path) -> None:
    local_warm.warm(3)
    extra = local_warm.warmed()[2]
    _run(tmp_path, RecordingPool(), workers=2)
    assert local_warm.warmed() == {}
    assert _gone(extra)


def test_a_member_that_died_waiting_is_replaced_by_a_cold_one(tmp_path: Path) -> None:
    local_warm.warm(2)
    warmed = local_warm.warmed()
    os.kill(warmed[0], signal.SIGKILL)
    wait_for(lambda: _gone(warmed[0]), timeout=30, what="the killed member to end")
    pool = RecordingPool()
    _run(tmp_path, pool)
    assert pool.served[1] == warmed[1] and pool.served[0] != warmed[0]
    assert Counter(r["k"] for r in read_jsonl_dir(tmp_path / "out")) == Counter(range(N))


def test_members_die_with_the_worker_that_warmed_them(tmp_path: Path) -> None:
    code = ("import json, os, sys\nfrom segue.executor import local_warm\nlocal_warm.warm(2)\n"
            "print(json.dumps(list(local_warm.warmed().values())), flush=True)\nos._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    pids = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(pids) == 2
    wait_for(lambda: all(_gone(p) for p in pids), timeout=30, what="orphaned members to end")


@pytest.mark.parametrize(("workers", "world_size", "warm"), [
    ((2, 2), 1, 2),  # a fixed data step: all of its sub-workers
    ((4, 4), 1, 4),
    ((1, 1), 1, 0),  # one worker: no sub-workers at all
    ((1, 3), 1, 0),  # elastic: it grows by the pool's grants
    ((1, 1), 2, 0),  # a gang: its ranks are placed as one group
])
def test_which_attempts_warm_their_sub_workers(workers: tuple[int, int], world_size: int, warm: int) -> None:
    spec = Launch(home=Path("h"), run_id="r", step="s", epoch=1, log_path=Path("l"), env={},
                  resources=Resources(workers=workers), world_size=world_size)
    assert warm_members(spec) == warm


def test_segue_run_warms_a_two_worker_steps_sub_workers(segue, tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"k": i, "v": f"r{i}"}) + "\n" for i in range(400)))
    flow = str(Path(__file__).parents[1] / "data" / "flows" / "mapparallel.py")
    segue("run", flow, "--run-id", "w2", "-p", f"input={inp}", "-p", f"out={tmp_path / 'out'}",
          env={"MAPPARALLEL_WORK_S": "0"}, check=True)
    log = segue("logs", "w2", "upper").stdout
    assert "sub-worker 0 (pid " in log and "sub-worker 1 (pid " in log, log[-2000:]
    assert log.count("was warmed with the attempt") == 2, log[-2000:]
    assert Counter(json.loads(x)["k"] for p in (tmp_path / "out").glob("part-*.jsonl")
                   for x in p.read_text().splitlines()) == Counter(range(400))


_FORKED = '''
import json, os, sys, threading
from segue.executor import local_warm
if sys.argv[1] == "thread":  # a process that already runs a thread must not fork
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
method = local_warm.warm(2)
procs = {i: p for i, (p, _) in local_warm._members.items()}
cmdlines = {i: open(f"/proc/{p.pid}/cmdline", "rb").read() for i, p in procs.items()}
mine = open("/proc/self/cmdline", "rb").read()
for i in sorted(local_warm._members):  # close each pipe by hand: the member must see EOF
    local_warm._members.pop(i)[1].close()
for p in procs.values():
    p.join(120)
print(json.dumps({"method": method, "exitcodes": [procs[i].exitcode for i in sorted(procs)],
                  "same_cmdline": [cmdlines[i] == mine for i in sorted(procs)]}))
if sys.argv[1] == "thread":
    stop.set()
'''


@pytest.mark.parametrize(("threads", "method"), [("none", "fork"), ("thread", "spawn")])
def test_members_are_forked_only_from_a_single_threaded_process(threads: str, method: str) -> None:
    out = subprocess.run([sys.executable, "-c", _FORKED, threads], capture_output=True, text=True,
                         timeout=180, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["method"] == method
    # A forked member is this very program (no new interpreter); a spawned one is not.
    assert got["same_cmdline"] == [method == "fork"] * 2
    # Each returned on its pipe's EOF (exit 0), though the member forked after it holds
    # copies of this process's ends: it closed them (None would mean it still waited).
    assert got["exitcodes"] == [0, 0], got
