"""Keeping `segue verify`'s two runs apart: outputs that would escape their sandboxes.

Each run works in a sandbox of its own (its working directory and home), so
a sink at a relative path lands inside it. A sink at an absolute path, or one
that climbs out with ``..``, is the same place for both runs: the faulted run
replaces what the clean run wrote, the sandboxes hold nothing, and nothing is
compared. So, before anything runs, each ``@flow.map`` step's declared sinks
are built as the step builds them (run id and parameters, the sandbox as the
working directory), and a sink outside the sandbox is

* remapped, when a parameter names it by an absolute path inside the user's
  working directory: each run gets that path relative to the working
  directory instead, so it writes ``SANDBOX/REL`` (exactly where a relative
  path would have put it);
* refused otherwise (UsageError: one line naming the parameter or the step
  and the fix), before anything ran.

Sinks a step builds inside its function are known only from its output (a
data step reports its "sink" and "dead_letter"): :func:`escaped` checks those
after each run.

Inputs go the other way: a parameter that is not a sink's and names, by a
relative path, something that exists in the user's working directory (an
input file, ``sqlite:///in.db``) is passed to both runs as an absolute path
(:func:`anchor_inputs`), so each reads what ``segue run`` would have read
instead of finding nothing in its empty sandbox.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError

SQLITE = "sqlite:///"
_LEDGER = re.compile(r"\(ledger (.+)\)$")  # ExternalCallSink.describe()


@dataclass
class Placed:
    step: str
    role: str  # "sink" | "dead-letter sink"
    where: str  # an absolute path, or a database URL


@contextmanager
def _cwd(path: Path) -> Iterator[None]:
    # The builders run as in the step's process, whose working directory is the
    # sandbox: a FileSink makes its path absolute when it is built.
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _where(sink: Any) -> str | None:
    """Where a sink writes: a path, a URL for a database of its own, None if unknown."""
    from ..data.sinks.external import ExternalCallSink
    from ..data.sinks.files import FileSink
    from ..data.sinks.sql import SqlSink

    if isinstance(sink, FileSink):
        return sink.directory
    if isinstance(sink, ExternalCallSink):
        return os.path.abspath(sink.ledger)
    if isinstance(sink, SqlSink):
        if not sink.url.startswith(SQLITE):
            return sink.url  # a server: shared by both runs
        path = sink.url[len(SQLITE):]
        return None if path in ("", ":memory:") else os.path.abspath(path)
    return None


def declared(steps: Mapping[str, Any], run_id: str, params: Mapping[str, Any],
             sandbox: Path) -> tuple[list[Placed], bool]:
    """The declared sinks of the flow's ``@flow.map`` steps, built in ``sandbox``; and
    whether the flow declares any (a builder that needs a live step context is skipped)."""
    from ..data.preflight import _SubmitContext

    placed: list[Placed] = []
    any_sink = False
    with _cwd(sandbox):
        for name, spec in steps.items():
            decl = getattr(spec.fn, "segue_map", None)
            if decl is None:
                continue
            for role, sink in (("sink", decl.sink), ("dead-letter sink", decl.dead_letter)):
                if sink is None:
                    continue
                any_sink = True
                try:
                    obj = sink if hasattr(sink, "preflight") else sink(_SubmitContext(run_id, name, params))
                except Exception:  # noqa: BLE001 - checked from the step's output after the run
                    continue
                if (where := _where(obj)) is not None:
                    placed.append(Placed(name, role, where))
    return placed, any_sink


def inside(where: str, root: Path) -> bool:
    if "://" in where:
        return False
    p, r = os.path.realpath(where), os.path.realpath(root)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def _as_path(value: str) -> str:
    return value.removeprefix(SQLITE).removeprefix("file://")


def param_for(where: str, params: Mapping[str, Any], sandbox: Path) -> str | None:
    """The parameter whose value names ``where`` (or a directory above it), most specific first."""
    best: tuple[int, str] | None = None
    for name, value in params.items():
        if not isinstance(value, str) or not value.strip():
            continue
        if "://" in where:
            hit = value in where
            size = len(value)
        else:
            cand = os.path.realpath(os.path.join(sandbox, _as_path(value)))
            hit = inside(where, Path(cand))
            size = len(cand)
        if hit and (best is None or size > best[0]):
            best = (size, name)
    return None if best is None else best[1]


def _refusal(p: Placed, name: str | None, params: Mapping[str, Any]) -> str:
    why = ("outside verify's sandboxes: the clean and the faulted run would write the same "
           "output and nothing would be compared")
    if "://" in p.where:
        fix = f"{SQLITE}NAME.db (a relative path, inside each sandbox)"
    else:
        fix = os.path.basename(p.where.rstrip(os.sep)) or "out"
    if name is None:
        return (f"step {p.step!r} writes its {p.role} to {p.where}, {why}; give it a relative path "
                f"(or one built from a parameter)")
    return (f"parameter {name!r} ({params[name]}) puts the {p.role} of step {p.step!r} at {p.where}, "
            f"{why}; pass a relative path (-p {name}={fix}), which each run resolves in its own sandbox")


def keep_inside(steps: Mapping[str, Any], run_id: str, params: dict[str, Any], overrides: dict[str, str],
                sandbox: Path, cwd: Path, log: Callable[[str], None] = lambda s: None,
                ) -> tuple[dict[str, str], dict[str, str], bool]:
    """(overrides with escaping sink paths remapped, the remapped ones, whether the flow
    declares sinks); UsageError for a declared sink outside ``sandbox`` that cannot be."""
    remapped: dict[str, str] = {}
    params = dict(params)
    while True:
        placed, any_sink = declared(steps, run_id, params, sandbox)
        out = next((p for p in placed if not inside(p.where, sandbox)), None)
        if out is None:
            return overrides, remapped, any_sink
        name = param_for(out.where, params, sandbox)
        value = params.get(name) if name is not None else None
        if name is None or name in remapped or not isinstance(value, str) or not os.path.isabs(value) \
                or not inside(value, cwd):
            raise UsageError(_refusal(out, name, params))
        rel = os.path.relpath(os.path.realpath(value), os.path.realpath(cwd))
        log(f"verify: parameter {name!r} ({value}) is inside the working directory; "
            f"each run writes it as {rel} in its own sandbox")
        remapped[name] = rel
        params[name] = rel
        overrides = {**overrides, name: rel}


def anchor_inputs(steps: Mapping[str, Any], run_id: str, params: Mapping[str, Any],
                  overrides: dict[str, str], sandbox: Path, cwd: Path,
                  log: Callable[[str], None] = lambda s: None) -> dict[str, str]:
    """``overrides`` with each relative parameter that names an existing path under ``cwd``,
    and no declared sink, made absolute: the runs read the user's input, not their sandbox."""
    placed, _ = declared(steps, run_id, params, sandbox)
    sink_params = {param_for(p.where, params, sandbox) for p in placed}
    out = dict(overrides)
    for name, value in params.items():
        if name in sink_params or not isinstance(value, str) or not value.strip():
            continue
        prefix = SQLITE if value.startswith(SQLITE) else ""
        path = value[len(prefix):]
        if (not prefix and "://" in value) or not path or os.path.isabs(path) \
                or not os.path.exists(os.path.join(cwd, path)):
            continue
        out[name] = prefix + os.path.abspath(os.path.join(cwd, path))
        log(f"verify: parameter {name!r} ({value}) names {out[name]} in the working directory; "
            f"both runs read it there")
    return out


def escaped(sinks: Mapping[str, list[str]], sandbox: Path, params: Mapping[str, Any], label: str) -> list[str]:
    """A line for each sink a run's step outputs report outside its sandbox."""
    lines = []
    for step, wheres in sorted(sinks.items()):
        for text in wheres:
            m = _LEDGER.search(text)
            where = m.group(1) if m else text
            if not os.path.isabs(where) or inside(where, sandbox):
                continue  # "table T": a SQL sink, placed by its URL
            name = param_for(where, params, sandbox)
            by = f" (parameter {name!r})" if name else ""
            fix = f" (-p {name}={os.path.basename(where.rstrip(os.sep)) or 'out'})" if name else ""
            lines.append(f"step {step!r} of the {label} run wrote to {where}{by}, outside its sandbox "
                         f"{sandbox}: both runs would write the same place, so their outputs cannot be "
                         f"compared; pass a relative path{fix}")
    return lines
