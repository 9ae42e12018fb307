"""Flows and steps: the declarative part of the public API.

A flow is a DAG of Python step functions declared in a plain ``.py`` file::

    flow = Flow("nightly", params={"epochs": 3, "lr": Param(0.1, help="step size")})

    @flow.step(retries=2, checkpoint_every="5s")
    def prepare(ctx): ...

    @flow.step(after=[prepare], gpus=1)
    def train(ctx): ...

This module only describes; it never runs anything and never touches storage.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._canon import digest
from ..errors import FlowError
from ..units import parse_bytes
from .mapfn import check_map_fn

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: str | float | int, what: str) -> float:
    """'500ms', '30s', '5m', '1h' or a number of seconds -> seconds (> 0)."""
    if isinstance(value, bool):
        raise FlowError(f"{what} must be a duration such as '30s' or 5.0, not {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise FlowError(f"{what} must be a duration such as '500ms', '30s' or '5m', not {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not seconds > 0 or not math.isfinite(seconds):  # nan compares false to everything
        raise FlowError(f"{what} must be a positive finite duration, not {value!r}")
    return seconds


def parse_memory(value: str | int | None, what: str) -> int | None:
    """'512MB', '40GB' (10^9 bytes), '2GiB' (2^30) or a number of bytes -> bytes; None stays None.

    :func:`segue.units.parse_bytes` reads it, as the CLI and the API do, so a flow's
    ``gpu_memory="40GB"`` asks for what ``--gpu-mem 40GB`` does.
    """
    return None if value is None else parse_bytes(value, what, error=FlowError)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def worker_range(workers: Any) -> tuple[int, int]:
    """``workers=N`` or ``workers=(min, max)`` as (min, max); FlowError if neither."""
    if _is_int(workers) and workers >= 1:
        return (workers, workers)
    if isinstance(workers, tuple | list) and len(workers) == 2 and all(_is_int(w) for w in workers) \
            and 1 <= workers[0] <= workers[1]:
        return (int(workers[0]), int(workers[1]))
    raise FlowError(f"flow.map: workers must be an int >= 1 or a pair (min, max) with "
                    f"1 <= min <= max, not {workers!r}")


# The data layer (above this one) hands flow the class a @flow.map step runs as when
# it is imported (segue/data/mapstep.py), so flow never imports data.
_MAP_STEP: Any = None


def use_map_step(cls: Any) -> None:
    """Called once by ``segue.data``: the class ``flow.map`` builds each data step with."""
    global _MAP_STEP
    _MAP_STEP = cls


def _map_step_class() -> Any:
    if _MAP_STEP is None:
        raise FlowError("flow.map needs the data layer: import segue.data in the flow file "
                        "(its sources and sinks come from there)")
    return _MAP_STEP


def _check_map_options(*, source: Any, sink: Any, batch_size: Any, batch_bytes: Any,
                       max_failures: Any, max_failure_rate: Any, workers: Any) -> None:
    """Refuse a bad ``@flow.map`` declaration when the flow loads, not when the step runs."""
    if source is None or sink is None:
        raise FlowError("flow.map needs a source= and a sink= (segue.data objects or functions of ctx)")
    worker_range(workers)
    for what, v in (("batch_size", batch_size), ("batch_bytes", batch_bytes)):
        if v is not None and (not _is_int(v) or v < 1):
            raise FlowError(f"flow.map: {what} must be an int >= 1 or None, not {v!r}")
    if max_failures is not None and (not _is_int(max_failures) or max_failures < 0):
        raise FlowError(f"flow.map: max_failures must be an int >= 0 or None, not {max_failures!r}")
    rate = max_failure_rate
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                             or not 0.0 <= rate <= 1.0):
        raise FlowError(f"flow.map: max_failure_rate must be a number from 0 to 1 or None, not {rate!r}")


def _check_model(model: Any, kind: str, batch_size: Any, batch_bytes: Any) -> None:
    """A ``model=`` must be a ModelHandler; its batching replaces the step's."""
    if not (callable(getattr(model, "session", None)) and callable(getattr(model, "identity", None))):
        raise FlowError(f"flow.map: model= must be a segue.inference.ModelHandler, not {type(model).__name__}")
    if kind not in ("map", "map_batches"):
        raise FlowError(f"flow.map: a step with model= maps batches; kind {kind!r} does not apply "
                        f"(filter or flatten in the function, which gets the whole batch)")
    if batch_size is not None or batch_bytes is not None:
        raise FlowError("flow.map: with model=, the handler sets the batch (ModelHandler(batch_size=...)); "
                        "drop batch_size/batch_bytes here")


@dataclass(frozen=True)
class Param:
    """A typed flow parameter. The type is taken from the default unless given."""

    default: Any
    type: type | None = None
    help: str = ""

    @property
    def kind(self) -> builtins.type:
        if self.type is not None:
            return self.type
        return type(self.default)


@dataclass(frozen=True)
class Resources:
    """What a step needs. Stored with the run; the scheduler enforces it."""

    cpus: float = 1.0
    gpus: int = 0
    memory: int | None = None  # bytes
    gpu_memory: int | None = None  # bytes used on each GPU; declared: the GPU may be shared
    accelerator: str | None = None  # a device type hint, e.g. "h100" or "rtx-pro-6000"
    # A map step's sub-workers (fewest, most); gpus and gpu_memory are per sub-worker.
    # (n, n): a fixed number; min < max: elastic (see docs/data.md).
    workers: tuple[int, int] = (1, 1)


@dataclass(frozen=True)
class StepSpec:
    name: str
    fn: Callable[..., Any]
    after: tuple[str, ...]
    resources: Resources
    retries: int
    checkpoint_every_s: float | None
    checkpoint_every_steps: int | None
    allow_pickle: bool
    checkpoint_auto: bool = False  # checkpoint_every="auto": Young/Daly from measured cost and MTBF
    mtbf_s: float | None = None  # configured mean time between failures, for "auto"
    keep_checkpoints: int = 3  # committed checkpoints kept per task; older ones are pruned
    model: Mapping[str, Any] | None = None  # the model handler's identity (name, version, config)
    # A gang step's ranks (``world_size=N``): N processes, each running ``fn`` with its
    # own ``ctx.rank``; their checkpoints are one, committed in two phases (run/gang.py).
    world_size: int = 1
    distributed: str | None = None  # "gloo" / "nccl": each rank joins a torch.distributed group
    # ``scratch="2GB"``: bytes ``ctx.scratch`` may hold at a checkpoint (its files are
    # saved with each checkpoint and put back before the next attempt); None: no scratch.
    scratch: int | None = None
    # Paths chosen at run time (docs/flows.md). A fan-out step runs once per item of
    # the list its parent ``foreach`` returned (or of ``[foreach_key]`` of it); a
    # branch point chooses which of ``choices`` (steps right after it) run; a loop
    # step runs again while ``until(output)`` is false, at most ``max_iterations`` times.
    foreach: str | None = None
    foreach_key: str | None = None
    choices: tuple[str, ...] = ()
    until: Callable[[Any], Any] | None = None
    max_iterations: int = 1
    # Files (paths, globs or fsspec URLs; ``{param}`` filled from the run's params) whose
    # listing the step decides from: snapshotted at its start, saved with its output,
    # compared again by `segue resume` (run/resume_inputs.py).
    inputs: tuple[str, ...] = ()

    @property
    def dynamic(self) -> bool:
        """A fan-out or a loop: its task only gathers the tasks the run creates for it
        (``NAME.K``), and is never run itself."""
        return self.foreach is not None or self.until is not None

    def source_digest(self) -> str:
        """Hash of the step function's source (and its model's identity), for the code fingerprint."""
        try:
            src = inspect.getsource(self.fn)
        except (OSError, TypeError):
            src = getattr(self.fn, "__qualname__", self.name)
        what: dict[str, Any] = {"name": self.name, "src": src, "after": list(self.after)}
        if self.model is not None:
            what["model"] = dict(self.model)
        if self.dynamic or self.choices:
            what["paths"] = {"foreach": self.foreach, "key": self.foreach_key, "choices": list(self.choices),
                             "until": _source(self.until), "max": self.max_iterations,
                             "inputs": list(self.inputs)}
        return digest(what)


def _source(fn: Callable[..., Any] | None) -> str | None:
    if fn is None:
        return None
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


def _scratch_size(scratch: str | int | None, name: str, fn: Callable[..., Any], world_size: Any) -> int | None:
    """``scratch=`` of step ``name`` in bytes (None: not declared); FlowError if it cannot be."""
    if scratch is None:
        return None
    size = parse_bytes(scratch, f"step {name!r}: scratch", error=FlowError)
    if size < 1:
        raise FlowError(f"step {name!r}: scratch must be a size above 0 such as '2GB', not {scratch!r}")
    if world_size != 1:
        raise FlowError(f"step {name!r}: scratch is not supported with world_size > 1 (a gang step's "
                        "ranks); keep the files in the state, or drop scratch=")
    if getattr(fn, "segue_map", None) is not None:
        raise FlowError(f"step {name!r}: scratch= applies to @flow.step functions, which get ctx; "
                        "a @flow.map step's functions never see it")
    return size


def _inputs(step: str, inputs: Iterable[str]) -> tuple[str, ...]:
    if isinstance(inputs, str):
        inputs = (inputs,)
    out = tuple(inputs)
    if not all(isinstance(i, str) and i.strip() for i in out):
        raise FlowError(f"step {step!r}: inputs must be paths, globs or URLs (strings), not {list(out)!r}")
    return out


def task_step(task: str) -> tuple[str, int | None]:
    """A task's step and index: ``"embed.17"`` (a fan-out's item 17, or a loop's
    iteration 17) is ``("embed", 17)``; a step's own task is ``(name, None)``."""
    step, dot, k = task.partition(".")
    return (step, int(k)) if dot and k.isdigit() else (task, None)


def child_task(step: str, k: int) -> str:
    """The task of item (or iteration) ``k`` of ``step``. Step names hold no dot."""
    return f"{step}.{k}"


@dataclass
class Flow:
    """A named DAG of steps with typed parameters."""

    name: str
    params: Mapping[str, Param | Any] = field(default_factory=dict)
    pause_on_failure: bool = False
    # Environment variables the run records at submit and checks at resume (run.environment).
    env: Iterable[str] = ()
    steps: dict[str, StepSpec] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise FlowError(f"flow name {self.name!r} must be a Python identifier of at most 64 characters")
        names = [self.env] if isinstance(self.env, str) else list(self.env)
        if isinstance(self.env, str) or any(not isinstance(n, str) or not re.fullmatch(
                r"[A-Za-z_][A-Za-z0-9_]{0,127}", n) for n in names) or len(set(names)) != len(names):
            raise FlowError(f"flow {self.name!r}: env must be a list of distinct variable names "
                            f"(letters, digits, '_'), not {self.env!r}")
        self.env = tuple(names)
        normalized: dict[str, Param] = {}
        for key, value in dict(self.params).items():
            if not _NAME.match(key):
                raise FlowError(f"parameter name {key!r} must be a Python identifier")
            p = value if isinstance(value, Param) else Param(value)
            if p.kind not in (int, float, str, bool, list, dict):
                raise FlowError(
                    f"parameter {key!r} has type {p.kind.__name__}; use int, float, str, bool, list or dict"
                )
            normalized[key] = p
        self.params = normalized

    def step(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        after: Iterable[str | Callable[..., Any]] = (),
        cpus: float = 1.0,
        gpus: int = 0,
        memory: str | int | None = None,
        gpu_memory: str | int | None = None,
        accelerator: str | None = None,
        retries: int = 0,
        checkpoint_every: str | float | None = None,
        checkpoint_every_steps: int | None = None,
        allow_pickle: bool = False,
        mtbf: str | float | None = None,
        keep_checkpoints: int = 3,
        world_size: int = 1,
        distributed: str | None = None,
        choices: Iterable[str | Callable[..., Any]] = (),
        inputs: Iterable[str] = (),
        scratch: str | int | None = None,
    ) -> Any:
        """Declare a step. Usable as ``@flow.step`` or ``@flow.step(...)``.

        ``world_size=N`` makes it a gang step: N ranks run ``fn`` at once, each with
        its ``ctx.rank``, on ``gpus`` devices each; every rank's ``ctx.checkpoint`` is
        one checkpoint of the whole gang, committed only once every rank's shard is
        durable; any rank's failure restarts the gang from the last such checkpoint;
        rank 0's return value is the step's output. ``distributed="gloo"`` (or
        ``"nccl"``) also joins the ranks in a torch.distributed process group. See
        docs/gang.md.

        ``scratch="2GB"``: ``ctx.scratch`` is a local directory whose files (at most
        that many bytes) are saved with every checkpoint and put back before the next
        attempt runs the function. See docs/checkpoint-format.md.

        ``choices``: this step is a branch point; it calls ``ctx.choose(...)`` with
        those of these steps (each runs right after it) that run; the others are
        SKIPPED. ``inputs``: the files (paths, globs, fsspec URLs, with ``{param}``
        filled in) the step decides from: their listing is saved with its output,
        and a resume that finds it changed refuses unless told what to do. See
        docs/flows.md.
        """

        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            name = f.__name__
            if not _NAME.match(name):
                raise FlowError(f"step name {name!r} must be a Python identifier")
            if name in self.steps:
                raise FlowError(f"flow {self.name!r} declares step {name!r} twice; rename one")
            if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
                raise FlowError(f"step {name!r}: retries must be a non-negative int, not {retries!r}")
            if (isinstance(cpus, bool) or not isinstance(cpus, int | float) or not cpus > 0
                    or not math.isfinite(cpus)):
                raise FlowError(f"step {name!r}: cpus must be a number > 0, not {cpus!r}")
            if not _is_int(gpus) or gpus < 0:
                raise FlowError(f"step {name!r}: gpus must be an int >= 0, not {gpus!r}")
            if accelerator is not None and (not isinstance(accelerator, str) or not accelerator.strip()):
                raise FlowError(f"step {name!r}: accelerator must be a device type such as 'h100' "
                                f"or 'rtx-pro-6000', not {accelerator!r}")
            every_steps = checkpoint_every_steps
            if every_steps is not None and (not _is_int(every_steps) or every_steps <= 0):
                raise FlowError(f"step {name!r}: checkpoint_every_steps must be a positive int")
            auto = checkpoint_every == "auto"
            every_s = (
                parse_duration(checkpoint_every, f"step {name!r}: checkpoint_every")
                if checkpoint_every is not None and not auto
                else None
            )
            if not _is_int(keep_checkpoints) or keep_checkpoints < 1:
                raise FlowError(f"step {name!r}: keep_checkpoints must be an int >= 1")
            if not _is_int(world_size) or world_size < 1:
                raise FlowError(f"step {name!r}: world_size must be an int >= 1 (its number of "
                                f"ranks), not {world_size!r}")
            if distributed not in (None, "gloo", "nccl"):
                raise FlowError(f"step {name!r}: distributed must be 'gloo' (CPU) or 'nccl' (GPU), "
                                f"not {distributed!r}")
            ups = tuple(a if isinstance(a, str) else a.__name__ for a in after)
            self.steps[name] = StepSpec(
                name=name,
                fn=f,
                after=ups,
                resources=Resources(
                    cpus=float(cpus),
                    gpus=int(gpus),
                    memory=parse_memory(memory, f"step {name!r}: memory"),
                    gpu_memory=parse_memory(gpu_memory, f"step {name!r}: gpu_memory"),
                    accelerator=accelerator.strip() if accelerator else None,
                    workers=(int(world_size), int(world_size)),  # gpus are per rank
                ),
                retries=retries,
                checkpoint_every_s=every_s,
                checkpoint_every_steps=every_steps,
                allow_pickle=allow_pickle,
                checkpoint_auto=auto,
                mtbf_s=None if mtbf is None else parse_duration(mtbf, f"step {name!r}: mtbf"),
                keep_checkpoints=keep_checkpoints,
                world_size=int(world_size),
                distributed=distributed,
                scratch=_scratch_size(scratch, name, f, world_size),
                choices=tuple(c if isinstance(c, str) else c.__name__ for c in choices),
                inputs=_inputs(name, inputs),
            )
            return f

        return register(fn) if fn is not None else register

    def map(
        self,
        *,
        source: Any,
        sink: Any,
        kind: str = "map",
        batch_size: int | None = None,
        batch_bytes: int | None = None,
        dead_letter: Any = None,
        max_failures: int | None = 1000,
        max_failure_rate: float | None = 0.05,
        workers: int | tuple[int, int] = 1,
        model: Any = None,
        **step_options: Any,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Declare a resumable data step: ``fn`` applied to every record, exactly once.

        ``source`` and ``sink`` are segue.data objects, or functions of the step
        context that build them (so they can use ``ctx.params``). ``kind`` is
        map, filter, flat_map or map_batches. ``workers`` > 1 runs the step over
        that many local sub-worker processes (see docs/data.md); ``workers=(min,
        max)`` is elastic: it starts with ``min``, grows while there is a backlog
        and free devices, shrinks when sub-workers run dry, and gives up spare
        sub-workers' devices to a more urgent run instead of pausing (partial
        preemption). ``gpus`` and ``gpu_memory`` are per sub-worker, and each
        sub-worker sees only its own devices. Other keywords
        are those of :meth:`step` (after, retries, checkpoint_every...). The
        step's output is the run's counters. See docs/data.md.

        The function is ``fn(record)`` (``fn(records)`` for map_batches); a
        parameter named ``params`` also gets the run's params:
        ``fn(record, params)`` or ``fn(record, *, params)`` (see
        :mod:`segue.flow.mapfn`).

        ``model``: a :class:`segue.inference.ModelHandler`. The function is then
        ``fn(batch, model)``, or ``fn(batch, model, params)`` to read the run's
        params, over batches of the handler's size, returning
        one output per record; the model loads once per attempt (per sub-worker
        with ``workers``), is released before a pause parks the step, and its
        name and version are part of the fingerprint. The handler's resource
        hints are the step's defaults. See docs/inference.md.
        """

        _check_map_options(source=source, sink=sink, batch_size=batch_size, batch_bytes=batch_bytes,
                           max_failures=max_failures, max_failure_rate=max_failure_rate,
                           workers=workers)
        if model is not None:
            _check_model(model, kind, batch_size, batch_bytes)
            for key, value in model.hints().items():
                step_options.setdefault(key, value)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            MapStep = _map_step_class()
            check_map_fn(fn, kind, model)
            decl = MapStep(fn, source, sink, kind=kind, batch_size=batch_size, batch_bytes=batch_bytes,
                           dead_letter=dead_letter, max_failures=max_failures,
                           max_failure_rate=max_failure_rate, workers=workers, model=model)

            @functools.wraps(fn)  # the fingerprint hashes the user's function, not this one
            def data_step(ctx: Any) -> Any:
                return decl.run(ctx)

            data_step.segue_map = decl  # type: ignore[attr-defined]  # sub-workers rebuild from it
            self.step(data_step, **step_options)
            name = data_step.__name__
            spec = self.steps[name]
            self.steps[name] = dataclasses.replace(
                spec, resources=dataclasses.replace(spec.resources, workers=worker_range(workers)))
            if model is not None:
                name = data_step.__name__
                self.steps[name] = dataclasses.replace(self.steps[name], model=model.identity())
            return fn

        if kind not in ("map", "filter", "flat_map", "map_batches"):
            raise FlowError(f"map kind {kind!r} is unknown; use map, filter, flat_map or map_batches")
        return register

    def foreach(self, over: str | Callable[..., Any], *, key: str | None = None,
                after: Iterable[str | Callable[..., Any]] = (), **step_options: Any) -> Any:
        """Declare a fan-out: the step runs once per item of the list step ``over``
        returned (``key``: of ``output[key]``), each item a task of its own
        (``NAME.0``, ``NAME.1``...) with its own attempts, checkpoints and retries.
        The function reads ``ctx.item`` and ``ctx.index``. The list is read from
        the committed output, so a resume never decides it again. Steps after it get
        the items' outputs as one list, in order. Other keywords are :meth:`step`'s.
        """
        parent = over if isinstance(over, str) else over.__name__
        if key is not None and not isinstance(key, str):
            raise FlowError(f"flow.foreach: key must be the name of a key of {parent}'s output, not {key!r}")
        for bad in ("choices", "world_size"):
            if step_options.get(bad) not in (None, (), [], 1):
                raise FlowError(f"flow.foreach: {bad}= does not apply to a fan-out step")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.step(fn, after=[parent, *after], **step_options)
            self.steps[fn.__name__] = dataclasses.replace(self.steps[fn.__name__], foreach=parent,
                                                          foreach_key=key)
            return fn

        return register

    def loop(self, *, until: Callable[[Any], Any], max_iterations: int,
             after: Iterable[str | Callable[..., Any]] = (), **step_options: Any) -> Any:
        """Declare a bounded loop: the step runs, then again while ``until(output)`` is
        false, at most ``max_iterations`` times. Each iteration is a task of its own
        (``NAME.0``, ``NAME.1``...), durable like any step: a resume continues at the
        iteration it was in. The function reads ``ctx.iteration`` and ``ctx.previous``
        (the last iteration's output, None at first). The step's output is its last
        iteration's. ``until`` runs in the step's process, on the output it returned.
        """
        if not callable(until):
            raise FlowError(f"flow.loop: until must be a function of the step's output, not {until!r}")
        if not _is_int(max_iterations) or max_iterations < 1:
            raise FlowError(f"flow.loop: max_iterations must be an int >= 1, not {max_iterations!r}")
        for bad in ("choices", "world_size"):
            if step_options.get(bad) not in (None, (), [], 1):
                raise FlowError(f"flow.loop: {bad}= does not apply to a loop step")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.step(fn, after=after, **step_options)
            self.steps[fn.__name__] = dataclasses.replace(self.steps[fn.__name__], until=until,
                                                          max_iterations=int(max_iterations))
            return fn

        return register

    def spec_of(self, task: str) -> StepSpec:
        """The step a task runs: ``embed.17`` runs step ``embed``."""
        return self.steps[task_step(task)[0]]

    # -- validation ----------------------------------------------------------
    def order(self) -> list[str]:
        """Steps in a deterministic topological order; raises FlowError on bad DAGs."""
        if not self.steps:
            raise FlowError(f"flow {self.name!r} has no steps; declare one with @flow.step")
        for spec in self.steps.values():
            for up in spec.after:
                if up not in self.steps:
                    known = ", ".join(sorted(self.steps))
                    raise FlowError(
                        f"step {spec.name!r} runs after unknown step {up!r}; known steps: {known}"
                    )
        order: list[str] = []
        state: dict[str, int] = {}  # 1 = visiting, 2 = done

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = path[path.index(name):] + [name]
                raise FlowError(f"flow {self.name!r} has a cycle: {' -> '.join(cycle)}")
            state[name] = 1
            for up in self.steps[name].after:
                visit(up, path + [name])
            state[name] = 2
            order.append(name)

        for name in self.steps:  # declaration order breaks ties: reproducible
            visit(name, [])
        self._check_paths()
        return order

    def _check_paths(self) -> None:
        for spec in self.steps.values():
            after_it = [s.name for s in self.steps.values() if spec.name in s.after]
            for c in spec.choices:
                if c not in after_it:
                    raise FlowError(f"step {spec.name!r} chooses among {list(spec.choices)}, but {c!r} does "
                                    f"not run right after it; declare it with after=[{spec.name}]")
            if spec.choices and (spec.dynamic or getattr(spec.fn, "segue_map", None) is not None):
                raise FlowError(f"step {spec.name!r}: choices= applies to a plain step, not to a "
                                "fan-out, a loop or a data step")
            if spec.dynamic and getattr(spec.fn, "segue_map", None) is not None:
                raise FlowError(f"step {spec.name!r}: a data step cannot also be a fan-out or a loop")
