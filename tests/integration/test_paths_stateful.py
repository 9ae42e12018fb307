"""Random flows with fan-outs, branches, loops and joins: a run under SIGKILLs of its
workers and its controller takes the path an uninterrupted run takes.

A Hypothesis state machine builds the flow a step at a time (each rule adds a kind of
step after earlier ones); at the end the flow runs twice, in two homes: once clean,
once with faults armed at random decision points of the controller and at the commit
of every first attempt of a worker, resumed after each controller kill until it ends,
the first of those resumes detached and paused with `segue pause --wait` wherever the
run then is (it may end first: pauses that landed are counted, not required).
Both runs must have the same tasks, in the same states (the same branches taken, the
same items, the same iterations), every output equal, and no task may commit twice.
The faults that landed are counted: a run that no fault reached proves nothing.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from segue_helpers import Segue, wait_for

HEADER = '''\
import hashlib
import json

from segue import Flow

flow = Flow("rand")


def h(*xs):
    return int(hashlib.sha256(json.dumps(xs, sort_keys=True).encode()).hexdigest()[:8], 16)


def out(name, *xs):
    v = h(name, *xs)
    return {"v": v % 1000, "items": [v % 97 + i for i in range(v % 4)]}
'''


class FlowBuilder:
    """The text of a flow, a step at a time; every step has retries for the worker kills."""

    def __init__(self) -> None:
        self.parts: list[str] = [HEADER]
        self.steps: list[str] = []  # steps a later one may run after
        self.tasks = 0  # tasks at most: a fan-out may add 3, a loop 3

    def _add(self, name: str, decorator: str, body: str) -> None:
        self.parts.append(f"\n\n{decorator}\ndef {name}(ctx):\n{body}")

    def plain(self, ups: list[str]) -> None:
        name = f"s{len(self.parts)}"
        self._add(name, f"@flow.step(after={ups!r}, retries=3)",
                  f"    return out({name!r}, [ctx.inputs[u] for u in {ups!r}])\n")
        self.steps.append(name)
        self.tasks += 1

    def fanout(self, parent: str) -> None:
        name = f"f{len(self.parts)}"
        self._add(name, f"@flow.foreach(over={parent!r}, key='items', retries=3)",
                  f"    return h({name!r}, ctx.item, ctx.index)\n")
        self.steps.append(name)
        self.tasks += 4

    def branch(self, ups: list[str]) -> None:
        name = f"b{len(self.parts)}"
        a, b = f"{name}a", f"{name}b"
        self._add(name, f"@flow.step(after={ups!r}, choices=[{a!r}, {b!r}], retries=3)",
                  f"    v = out({name!r}, [ctx.inputs[u] for u in {ups!r}])\n"
                  f"    ctx.choose({a!r} if v['v'] % 2 else {b!r})\n"
                  "    return v\n")
        for side in (a, b):
            self._add(side, f"@flow.step(after=[{name!r}], retries=3)",
                      f"    return out({side!r}, ctx.inputs[{name!r}])\n")
        self.steps += [name, a, b]
        self.tasks += 3

    def loop(self, ups: list[str]) -> None:
        name = f"l{len(self.parts)}"
        self._add(name, f"@flow.loop(after={ups!r}, until=lambda o: o['v'] % 3 == 0, max_iterations=3, retries=3)",
                  f"    return out({name!r}, ctx.iteration, ctx.previous, [ctx.inputs[u] for u in {ups!r}])\n")
        self.steps.append(name)
        self.tasks += 4

    def text(self) -> str:
        return "".join(self.parts)


def run_to_the_end(segue: Segue, flow: Path, rng: random.Random | None) -> dict[str, int]:
    """Run ``flow`` to its end; with ``rng``, under faults. Returns the faults that landed."""
    landed = Counter[str]()
    landed["pause"] = 0
    env = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
    if rng is not None:  # first round: every worker's first attempt dies before its commit
        env |= {"SEGUE_FAULTS": f"worker.before_complete:kill:1,controller.before_decision:kill:{rng.randint(1, 3)}",
                "SEGUE_FAULTS_EPOCHS": "1"}
    proc = segue("run", str(flow), "--run-id", "r", env=env, timeout=600)
    for _ in range(30):
        if proc.returncode != -9:
            break
        landed["controller"] += 1
        assert rng is not None, proc.stderr
        if landed["controller"] == 1:  # the first resume:
            # A pause, wherever it lands: a detached controller, then `segue pause --wait`.
            assert segue("resume", "r", "--detach", timeout=600).returncode == 0
            wait_for(lambda: (lambda st: st["controller"]["alive"] or st["state"] == "SUCCEEDED")(
                segue.status("r")), 120, "the detached controller to hold the run")
            segue("pause", "r", "--wait", "--timeout", "300", timeout=600)
            state = segue.status("r")["state"]
            if state == "SUCCEEDED":  # it ended before the pause came: nothing left to resume
                break
            assert state == "PAUSED", state
            landed["pause"] += 1
        point = rng.choice(["controller.before_decision", "controller.after_decision"])
        proc = segue("resume", "r", env={"SEGUE_FAULTS": f"{point}:kill:{rng.randint(1, 3)}",
                                         "SEGUE_FAULTS_IN": "controller"}, timeout=600)
    assert proc.returncode == 0 or segue.status("r")["state"] == "SUCCEEDED", (proc.returncode, proc.stderr[-3000:])
    landed["worker"] = sum(1 for e in segue.events("r") if e["kind"] == "task" and e["to_state"] == "RETRYING")
    return dict(landed)


def outcome(segue: Segue) -> dict[str, Any]:
    st_ = segue.json("status", "r", "--items")
    tasks: dict[str, str] = {}
    for s in st_["steps"]:
        tasks[s["name"]] = s["state"]
        for kid in (s.get("items") or {}).get("tasks", []):
            tasks[kid["name"]] = kid["state"]
    events = segue.events("r")
    commits = Counter(e["step"] for e in events if e["kind"] == "task" and e["to_state"] == "SUCCEEDED")
    assert max(commits.values()) == 1, commits  # no task committed twice
    chose = {e["step"]: (e["data"].get("kind"), e["data"].get("chose"), e["data"].get("added"))
             for e in events if e["kind"] == "decision" and e["data"].get("kind") != "loop"}
    outputs = {name: segue.output("r", name) for name, state in tasks.items() if state == "SUCCEEDED"}
    return {"state": st_["state"], "tasks": tasks, "decisions": chose, "outputs": outputs}


@settings(max_examples=4, stateful_step_count=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
class RandomPaths(RuleBasedStateMachine):
    """Rules add steps after earlier ones; the teardown runs the flow twice and compares."""

    def __init__(self) -> None:
        super().__init__()
        self.flow = FlowBuilder()

    @initialize(seed=st.integers(0, 2**16))
    def first(self, seed: int) -> None:
        self.seed = seed
        self.flow.plain([])

    def _ups(self, data: st.DataObject, most: int = 2) -> list[str]:
        n = data.draw(st.integers(1, min(most, len(self.flow.steps))))
        return sorted(data.draw(st.lists(st.sampled_from(self.flow.steps), min_size=n, max_size=n, unique=True)))

    @precondition(lambda self: self.flow.tasks < 26)
    @rule(data=st.data())
    def plain(self, data: st.DataObject) -> None:
        self.flow.plain(self._ups(data))

    @precondition(lambda self: self.flow.tasks < 26)
    @rule(data=st.data())
    def fanout(self, data: st.DataObject) -> None:
        parents = [s for s in self.flow.steps if s.startswith(("s", "b")) and not s.endswith(("a", "b"))]
        if parents:
            self.flow.fanout(data.draw(st.sampled_from(parents)))

    @precondition(lambda self: self.flow.tasks < 26)
    @rule(data=st.data())
    def branch(self, data: st.DataObject) -> None:
        self.flow.branch(self._ups(data, most=1))

    @precondition(lambda self: self.flow.tasks < 26)
    @rule(data=st.data())
    def loop(self, data: st.DataObject) -> None:
        self.flow.loop(self._ups(data, most=1))

    @precondition(lambda self: len(self.flow.steps) >= 3 and self.flow.tasks < 26)
    @rule(data=st.data())
    def join(self, data: st.DataObject) -> None:
        self.flow.plain(self._ups(data, most=3))

    @invariant()
    def bounded(self) -> None:
        assert self.flow.tasks <= 30

    def teardown(self) -> None:
        base = Path(self.tmp) / f"example-{self.seed}-{len(self.flow.parts)}"
        base.mkdir(parents=True)
        flow = base / "rand.py"
        flow.write_text(self.flow.text())
        clean, faulty = Segue(base / "clean"), Segue(base / "faulty")
        run_to_the_end(clean, flow, None)
        landed = run_to_the_end(faulty, flow, random.Random(self.seed))
        assert landed.get("worker", 0) >= 1, landed  # every first attempt died: at least one did
        want, got = outcome(clean), outcome(faulty)
        assert got["state"] == want["state"] == "SUCCEEDED"
        assert got["tasks"] == want["tasks"]  # the same tasks, the same path, the same items
        assert got["decisions"] == want["decisions"]
        assert got["outputs"] == want["outputs"]
        LANDED.update(landed)
        SIZES.append((self.flow.tasks, len(got["tasks"]), dict(landed)))


LANDED: Counter[str] = Counter()
SIZES: list[Any] = []


def test_random_flows_take_the_same_path_under_kills(tmp_path: Path, _test_pool: Path) -> None:
    RandomPaths.tmp = str(tmp_path)  # type: ignore[attr-defined]
    LANDED.clear()
    RandomPaths.TestCase().runTest()
    # Across the examples, faults landed in workers and in the controller alike.
    assert LANDED["worker"] >= 4 and LANDED["controller"] >= 1, (LANDED, SIZES)
    print("examples (declared tasks, tasks, faults landed):", SIZES)

