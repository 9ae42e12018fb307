"""Paths chosen at run time: fan-outs, branches and bounded loops (docs/flows.md).

A flow's steps are declared before it runs; its path is not. Three kinds of step
decide it while the run goes:

- a **fan-out** (``@flow.foreach(over=parent)``) becomes one task per item of the
  list its parent returned: ``NAME.0``, ``NAME.1``...;
- a **branch point** (``@flow.step(choices=[...])``) calls ``ctx.choose(...)``;
  the steps it did not choose, and those after only them, become SKIPPED;
- a **loop** (``@flow.loop(until=..., max_iterations=N)``) becomes ``NAME.0``,
  then ``NAME.1`` while ``until`` was false of the last output, at most N.

What decides is always committed first: the parent's output (its list), the branch
point's output (its choice, saved with it), an iteration's output (``until``'s
verdict, computed in its own process and saved with it). The controller reads it
and records the decision (:meth:`Store.record_decision`: one transaction, fenced by
its epoch) before any task it creates or leaves out could start, so a resume, or a
controller that takes over, reads the same committed facts and never decides anew.

A fan-out's or a loop's own task is a group: it is never run. It succeeds once its
tasks did, its output being their outputs in order (a fan-out) or the last one's (a
loop). This module is the decision logic; the controller applies what it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._canon import digest
from ..errors import FlowError
from ..flow.model import StepSpec, child_task, task_step
from ..states import TaskState
from ..store.base import TaskRecord
from .stepio import GATHER, gather_ref

ItemLoader = Callable[[str], Any]  # a task's name -> its output's value
StateLoader = Callable[[str, str], Mapping[str, Any]]  # (task, output reference) -> the saved state


class PathError(FlowError):
    """A step broke its part in deciding the run's path; no retry can help."""

    segue_retryable = False


# -- in the step's process --------------------------------------------------------------------
def task_path(spec: StepSpec, task: str, load: ItemLoader) -> dict[str, Any]:
    """Where a task stands on the run's path: its item and index (a fan-out's), or its
    iteration and the previous iteration's output (a loop's). Empty for a plain task."""
    step, k = task_step(task)
    if k is None:
        return {}
    if spec.foreach is not None:
        items = fanout_items(spec, load(spec.foreach))
        return {"index": k, "item": items[k]}
    return {"iteration": k, "previous": None if k == 0 else load(child_task(step, k - 1))}


def fanout_items(spec: StepSpec, output: Any) -> list[Any]:
    """The list a fan-out runs over, from its parent's output."""
    items = output
    if spec.foreach_key is not None:
        if not isinstance(output, Mapping) or spec.foreach_key not in output:
            raise PathError(f"step {spec.name!r} fans out over {spec.foreach}[{spec.foreach_key!r}], but "
                            f"{spec.foreach!r} returned {_kind(output)} without that key")
        items = output[spec.foreach_key]
    if not isinstance(items, list | tuple):
        where = spec.foreach if spec.foreach_key is None else f"{spec.foreach}[{spec.foreach_key!r}]"
        raise PathError(f"step {spec.name!r} fans out over {where}, which is {_kind(items)}, not a "
                        "list; return a list (of JSON values, tensors or arrays)")
    return list(items)


def _kind(v: Any) -> str:
    return "None" if v is None else f"a {type(v).__name__}"


def snapshot_inputs(spec: StepSpec, params: Mapping[str, Any]) -> dict[str, Any]:
    """The listing of the files a step decides from (``inputs=``), as a data step pins
    its input: ``{"kind": "files", "urls": [...], "items": {path: {size, mtime|etag}}}``.
    A pattern that matches nothing lists nothing (no file yet is a state like any)."""
    from ..data.sources.files import file_attrs, list_files
    from ..errors import MissingInputError

    urls, items = [], {}
    for pattern in spec.inputs:
        try:
            url = pattern.format(**params)
        except (KeyError, IndexError, ValueError) as exc:
            raise PathError(f"step {spec.name!r}: inputs entry {pattern!r} names {exc} that is not a "
                            "parameter of the run; use {NAME} for a flow parameter") from None
        urls.append(url)
        try:
            fs, paths = list_files(url)
        except MissingInputError:
            continue
        items.update({p: file_attrs(fs, p) for p in paths})
    return {"kind": "files", "urls": urls, "items": dict(sorted(items.items()))}


def decided(spec: StepSpec, chosen: tuple[str, ...] | None, output: Any,
            inputs: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What a finished task decided, to be saved with its output (None: nothing), with
    the listing of the files it decided from (``inputs``, taken at its start)."""
    extra = {} if inputs is None else {"inputs": inputs}
    return {**_decision(spec, chosen, output), **extra} or None


def _decision(spec: StepSpec, chosen: tuple[str, ...] | None, output: Any) -> dict[str, Any]:
    if spec.choices:
        if chosen is None:
            raise PathError(f"step {spec.name!r} is a branch point (choices={list(spec.choices)}) "
                            "and returned without calling ctx.choose(...); call it with the "
                            "steps to run")
        return {"chose": list(chosen)}
    if spec.until is not None:
        return {"until": bool(spec.until(output))}
    return {}


# -- in the controller ------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    """One ``record_decision`` to make."""

    step: str  # the step that decided: a branch point, a fan-out, a loop, or a skipped one
    reason: str
    add: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0  # the epoch the tasks it adds start at (above those a restart dropped)


@dataclass(frozen=True)
class Completion:
    """A group whose tasks all succeeded: it succeeds with ``output_ref``."""

    step: str
    output_ref: str | None
    reason: str


@dataclass
class Plan:
    decisions: list[Decision] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)


class Paths:
    """The decisions a run's committed state calls for, and the order its tasks run in.

    ``steps``: the flow's steps; ``order``: their topological order; ``read_state``:
    the saved state of an output reference (its value and what was decided with it).
    ``decided``: the steps whose decision the store holds already (its events).
    """

    def __init__(self, steps: Mapping[str, StepSpec], order: list[str], read_state: StateLoader,
                 read_value: ItemLoader, decided: set[str]) -> None:
        self.steps, self.order = steps, order
        self.read_state, self.read_value = read_state, read_value
        self.decided = decided
        self.floors: dict[str, int] = {}  # group -> the highest epoch of its tasks a restart dropped

    # -- what runs, in which order ------------------------------------------------------
    @staticmethod
    def children(tasks: Mapping[str, TaskRecord]) -> dict[str, list[str]]:
        """Each group's tasks, by index."""
        out: dict[str, list[tuple[int, str]]] = {}
        for name in tasks:
            step, k = task_step(name)
            if k is not None:
                out.setdefault(step, []).append((k, name))
        return {s: [n for _, n in sorted(v)] for s, v in out.items()}

    def expanded_order(self, tasks: Mapping[str, TaskRecord]) -> list[str]:
        """Every task in the order they run: a group's tasks where the group stands."""
        kids = self.children(tasks)
        out: list[str] = []
        for name in self.order:
            if self.steps[name].dynamic:
                out += kids.get(name, [])
            out.append(name)
        return out

    def may_start(self, name: str, tasks: Mapping[str, TaskRecord]) -> bool:
        """A PENDING task whose turn it is: every step it runs after settled, at least one
        of them succeeded (or it has none), and every branch point among them decided. A
        group's own task never starts: its tasks do."""
        step, k = task_step(name)
        spec = self.steps[step]
        if k is None and spec.dynamic:
            return False
        if k is not None:  # the group was expanded only once its turn came
            return True
        ups = [tasks[u] for u in spec.after]
        if not all(u.state.settled for u in ups):
            return False
        if ups and not any(u.state == TaskState.SUCCEEDED for u in ups):
            return False
        return all(u.step in self.decided for u in ups if self.steps[u.step].choices)

    # -- decisions --------------------------------------------------------------------
    def plan(self, tasks: Mapping[str, TaskRecord]) -> Plan:
        plan = Plan()
        kids = self.children(tasks)
        for name in self.order:
            spec, t = self.steps[name], tasks[name]
            if t.state == TaskState.SUCCEEDED and spec.choices and name not in self.decided:
                plan.decisions.append(self._branch(name, t, tasks))
                continue
            if t.state != TaskState.PENDING:
                continue
            ups = [tasks[u] for u in spec.after]
            if not all(u.state.settled for u in ups):
                continue
            if ups and all(u.state == TaskState.SKIPPED for u in ups):
                plan.decisions.append(Decision(name, f"every step {name} runs after was skipped",
                                               skip=(name,), data={"kind": "skip"}))
                continue
            if not spec.dynamic or any(self.steps[u.step].choices and u.step not in self.decided for u in ups):
                continue
            if spec.foreach is not None:
                self._fanout(plan, name, spec, kids.get(name, []), tasks)
            else:
                self._loop(plan, name, spec, kids.get(name, []), tasks)
        return plan

    def _branch(self, name: str, t: TaskRecord, tasks: Mapping[str, TaskRecord]) -> Decision:
        state = self.read_state(name, t.output_ref) if t.output_ref else {}
        chose = [c for c in state.get("chose", []) if c in self.steps[name].choices]
        if not chose:  # an output saved without its choice: not of this code (a changed flow)
            raise PathError(f"branch point {name!r} succeeded without a recorded choice; restart it "
                            f"with `segue resume --restart-step {name}`")
        skip = [c for c in self.steps[name].choices if c not in chose]
        return Decision(name, f"{name} chose {', '.join(chose)}"
                        + (f"; {', '.join(skip)} skipped" if skip else ""),
                        skip=tuple(self._downstream_skips(skip, tasks)),
                        data={"kind": "branch", "chose": chose, "output_ref": t.output_ref,
                              **_inputs_digest(state)})

    def _downstream_skips(self, skip: list[str], tasks: Mapping[str, TaskRecord]) -> list[str]:
        """``skip`` and every step that would then run after skipped steps only."""
        out = list(skip)
        gone = set(skip) | {n for n, t in tasks.items() if t.state == TaskState.SKIPPED}
        for name in self.order:
            ups = self.steps[name].after
            if name not in gone and ups and all(u in gone for u in ups):
                gone.add(name)
                out.append(name)
        return out

    def _fanout(self, plan: Plan, name: str, spec: StepSpec, kids: list[str],
                tasks: Mapping[str, TaskRecord]) -> None:
        assert spec.foreach is not None
        if name not in self.decided:
            parent = tasks[spec.foreach]
            # The parent's output read once: its saved state holds the value and the listing
            # of its inputs; a fan-out's own (gather) output is its items', read one by one.
            ref = parent.output_ref
            own = ref is not None and not ref.startswith(GATHER)
            state = self.read_state(spec.foreach, ref) if own and ref else {}
            items = fanout_items(spec, state.get("value") if own else self.read_value(spec.foreach))
            plan.decisions.append(Decision(
                name, f"{name} fans out over {len(items)} item(s) of {spec.foreach}",
                add=tuple(child_task(name, i) for i in range(len(items))), epoch=self.floors.get(name, 0),
                data={"kind": "foreach", "items": len(items), "over": spec.foreach,
                      "output_ref": parent.output_ref, "digest": digest(_jsonable(items)),
                      **_inputs_digest(state)}))
        elif all(tasks[k].state == TaskState.SUCCEEDED for k in kids):
            plan.completions.append(Completion(name, gather_ref(len(kids)),
                                               f"its {len(kids)} item(s) succeeded"))

    def _loop(self, plan: Plan, name: str, spec: StepSpec, kids: list[str],
              tasks: Mapping[str, TaskRecord]) -> None:
        if not kids:
            if name not in self.decided:
                plan.decisions.append(Decision(name, f"{name}: iteration 0", add=(child_task(name, 0),),
                                               data={"kind": "loop", "iteration": 0},
                                               epoch=self.floors.get(name, 0)))
            return
        last = tasks[kids[-1]]
        if last.state != TaskState.SUCCEEDED:
            return
        k = len(kids) - 1
        done = bool(self.read_state(last.step, last.output_ref).get("until")) if last.output_ref else False
        if done or k + 1 >= spec.max_iterations:
            why = "until() held" if done else f"max_iterations ({spec.max_iterations}) reached"
            plan.completions.append(Completion(name, last.output_ref, f"iteration {k} ended the loop: {why}"))
        else:
            plan.decisions.append(Decision(name, f"{name}: iteration {k + 1} (until() was false of "
                                                 f"iteration {k})", add=(child_task(name, k + 1),),
                                           data={"kind": "loop", "iteration": k + 1,
                                                 "output_ref": last.output_ref},
                                           epoch=self.floors.get(name, 0)))


def _inputs_digest(state: Mapping[str, Any]) -> dict[str, Any]:
    snap = state.get("inputs")
    return {} if snap is None else {"inputs": len(snap.get("items", {})), "inputs_digest": digest(snap)}


def _jsonable(items: list[Any]) -> Any:
    """What a fan-out's items are digested as: tensors and arrays by their bytes."""
    out: list[Any] = []
    for v in items:
        if hasattr(v, "tobytes"):
            out.append({"bytes": digest(v.tobytes().hex())})
        elif hasattr(v, "numpy"):
            out.append({"bytes": digest(v.detach().cpu().numpy().tobytes().hex())})
        else:
            out.append(v)
    return out
