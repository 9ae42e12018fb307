"""The environment a run runs in: recorded at submit, compared at resume (issue 38 §5).

What is recorded (:func:`capture`): the Python version, every installed
distribution with its version, the variables the flow declares
(``Flow(..., env=[...])``), the CUDA driver, its CUDA version, the CUDA
runtime torch was built with and the GPU types where there are any, and the
digest of the flow file. A declared variable is kept as a salted digest of
its value, and its value only when it is short and neither its name nor its
value looks secret (:func:`is_secret`); so a secret never reaches the store.

Where it is kept: events of kind ``environment`` (no schema of their own).
The run's baseline is the newest one without a step (written at submit, and
again by a resume that went on over changes); each worker adds, per step,
the top-level modules its process imported, before each checkpoint commit
and when the attempt ends (:class:`ImportsRecorder`: it compares
``sys.modules`` with what it wrote already, and writes only what is new).

At resume (:func:`check_resume`) the baseline is compared with the
environment now. A change in a distribution that an unfinished step's process
imported, or in a declared variable, is refused (one line, exit 2, nothing
written) unless the run's ``on_env_change`` option is ``warn`` or ``allow``;
every other change is a warning. Modules are mapped to distributions at
resume, not in the worker (``packages_distributions`` reads every RECORD:
about a third of a second, paid once per resume, not once per attempt).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..flow.model import task_step
from ..states import Actor
from ..store.base import Event, RunRecord, Store

KIND = "environment"
FORMAT = 1
POLICIES = ("fail", "warn", "allow")
NVIDIA_SMI_TIMEOUT_S = 5.0
SMI_CACHE_S = 60.0  # a long-lived process asks nvidia-smi at most this often
_VALUE_MAX = 1024  # longer values are kept as their digest only

# A name with one of these words (between underscores, or at an end; a plural too) holds a secret:
# HF_TOKEN, AWS_SECRET_ACCESS_KEY, OPENAI_API_KEY, PGPASSWORD, DATABASE_DSN...
_SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PGPASSWORD", "PASSPHRASE", "PASS", "PWD", "KEY",
                 "APIKEY", "ACCESSKEY", "CREDENTIAL", "AUTH", "PRIVATE", "SIGNATURE", "COOKIE", "SESSION",
                 "SALT", "DSN", "CERT"}
# A value that carries a password of its own: scheme://user:password@host
_URL_PASSWORD = re.compile(r"://[^/\s:@]*:[^/\s@]+@")


def is_secret(name: str, value: str | None = None) -> bool:
    """True for a variable whose value must never be stored: its name matches a secret
    pattern, or its value holds a URL's password."""
    words = name.upper().split("_")
    return (any(w in _SECRET_WORDS or (w.endswith("S") and w[:-1] in _SECRET_WORDS) for w in words)
            or (value is not None and bool(_URL_PASSWORD.search(value))))


SECRET_ROUNDS = 100_000  # PBKDF2 rounds of a secret's digest: its salt is stored beside it


def _digest(salt: str, name: str, value: str, *, secret: bool = False) -> str:
    """A value's digest under the record's salt. A secret's is PBKDF2, slow on purpose: whoever
    reads the record (a viewer of the run's events) must not be able to guess a weak one."""
    data, key = f"{name}={value}".encode(), bytes.fromhex(salt)
    if secret:
        return f"pbkdf2-sha256:{SECRET_ROUNDS}:" + hashlib.pbkdf2_hmac("sha256", data, key, SECRET_ROUNDS).hex()
    return "hmac-sha256:" + hmac.new(key, data, hashlib.sha256).hexdigest()


def _same(recorded_digest: str, salt: str, name: str, value: str) -> bool:
    now = _digest(salt, name, value, secret=recorded_digest.startswith("pbkdf2-"))
    return hmac.compare_digest(recorded_digest, now)


def variable_entry(salt: str, name: str, value: str | None) -> dict[str, Any]:
    """How a declared variable is recorded: ``{"set": False}``, or its salted digest,
    with the value itself only when it is short and not secret."""
    if value is None:
        return {"set": False}
    secret = is_secret(name, value)
    entry: dict[str, Any] = {"set": True, "digest": _digest(salt, name, value, secret=secret)}
    if secret:
        entry["secret"] = True
    elif len(value) <= _VALUE_MAX:
        entry["value"] = value
    return entry


# -- capture ---------------------------------------------------------------------------


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


_CACHE: dict[str, tuple[Any, Any]] = {}


def _cached(name: str, key: Any, make: Callable[[], Any]) -> Any:
    """``make()``, again only when ``key`` changed (a long-lived process: the server's run page)."""
    hit = _CACHE.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    value = make()
    _CACHE[name] = (key, value)
    return value


def _path_key() -> tuple[tuple[str, int], ...]:
    """``sys.path`` with each directory's mtime: installing, upgrading or removing a
    distribution adds or removes a ``.dist-info`` directory there, which changes it."""
    out = []
    for p in sys.path:
        try:
            out.append((p, os.stat(p or ".").st_mtime_ns))
        except OSError:
            out.append((p, -1))
    return tuple(out)


def installed_distributions() -> dict[str, str]:
    """Every distribution on ``sys.path`` by normalized name, with its version; the
    first of two with one name wins, as an import would find it."""
    return dict(_cached("distributions", _path_key(), _installed))


def _installed() -> dict[str, str]:
    import importlib.metadata  # (here: a worker imports this module, and never needs it)

    out: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        with contextlib.suppress(Exception):  # a broken dist-info must not fail a submit
            name = dist.metadata["Name"]
            if name:
                out.setdefault(normalize(name), str(dist.version))
    return dict(sorted(out.items()))


def module_distributions() -> dict[str, list[str]]:
    """Top-level module name -> the (normalized) distributions that provide it."""
    return dict(_cached("modules", _path_key(), _module_distributions))


def _module_distributions() -> dict[str, list[str]]:
    import importlib.metadata

    try:
        found = importlib.metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - a broken dist-info: nothing can be mapped
        return {}
    return {mod: sorted({normalize(d) for d in dists}) for mod, dists in found.items()}


def parse_smi_query(text: str) -> tuple[str | None, list[str]]:
    """(driver version, GPU names) from ``nvidia-smi --query-gpu=name,driver_version
    --format=csv,noheader``: one "NAME, DRIVER" line per GPU."""
    driver, names = None, []
    for line in text.splitlines():
        if "," not in line:
            continue
        name, _, version = line.rpartition(",")
        if name.strip():
            names.append(name.strip())
        driver = driver or (version.strip() or None)
    return driver, names


def parse_smi_header(text: str) -> str | None:
    """The CUDA version the driver supports, from plain ``nvidia-smi``'s header
    (``... Driver Version: 550.54.15  CUDA Version: 12.4 |``)."""
    m = re.search(r"CUDA Version:\s*([0-9][0-9.]*)", text)
    return m.group(1) if m else None


def torch_cuda_runtime() -> str | None:
    """The CUDA runtime torch was built with, read from its ``torch/version.py``
    without importing torch (``cuda = '12.1'``; None for a CPU build or no torch)."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        text = Path(str(dist.locate_file("torch/version.py"))).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([0-9][0-9.]*)['\"]", text, re.M)
    return m.group(1) if m else None


def _run_smi(smi: str, *args: str) -> str | None:
    import subprocess

    try:
        res = subprocess.run([smi, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def capture_cuda(distributions: Mapping[str, str], smi: str | None = None) -> dict[str, Any] | None:
    """The CUDA driver (and its CUDA version) and GPU types through ``nvidia-smi``, if it is on
    the PATH (each call with a timeout; a failure is "not present"), and the CUDA runtimes the
    installed wheels carry. None when there is none of it (a machine without GPUs)."""
    import shutil

    out: dict[str, Any] = {}
    smi = smi if smi is not None else shutil.which("nvidia-smi")
    if smi:
        out.update(_cached("smi", (smi, int(time.monotonic() // SMI_CACHE_S)), lambda: _smi_facts(smi)))
    runtime: dict[str, str] = {}
    if (t := torch_cuda_runtime()) is not None:
        runtime["torch"] = t
    for name, version in distributions.items():  # pip's CUDA runtime wheels
        if name.startswith("nvidia-cuda-runtime"):
            runtime[name] = version
    if runtime:
        out["runtime"] = runtime
    return out or None


def _smi_facts(smi: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    query = _run_smi(smi, "--query-gpu=name,driver_version", "--format=csv,noheader")
    if query:
        driver, names = parse_smi_query(query)
        if driver:
            out["driver"] = driver
        if names:
            out["gpus"] = names
    header = _run_smi(smi)
    if header and (version := parse_smi_header(header)):
        out["driver_cuda"] = version
    return out


def file_digest(path: str | os.PathLike[str]) -> str | None:
    try:
        return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def capture(declared: Sequence[str], flow_path: str | os.PathLike[str] | None, *,
            environ: Mapping[str, str] | None = None, salt: str | None = None,
            smi: str | None = None) -> dict[str, Any]:
    """This process's environment as a run records it (see the module's doc). Never raises
    for what it cannot find out: that part is left out."""
    import platform
    import secrets

    environ = os.environ if environ is None else environ
    salt = salt or secrets.token_hex(16)
    dists = installed_distributions()
    return {
        "format": FORMAT,
        "python": {"version": platform.python_version(), "implementation": sys.implementation.name,
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "machine": platform.machine(),
                     "release": platform.release()},
        "distributions": dists,
        "salt": salt,
        "variables": {name: variable_entry(salt, name, environ.get(name)) for name in declared},
        "cuda": capture_cuda(dists, smi),
        "flow": {"path": None if flow_path is None else str(flow_path),
                 "digest": None if flow_path is None else file_digest(flow_path)},
    }


# -- what a step's process imported -------------------------------------------------------

_NOT_DISTRIBUTED = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names) | {"__main__"}


def imported_modules() -> set[str]:
    """The top-level names of the modules this process imported, less the standard library's."""
    return {n.partition(".")[0] for n in list(sys.modules)} - _NOT_DISTRIBUTED


class ImportsRecorder:
    """Writes, as an ``environment`` event of the step, the top-level modules its process
    imported that it has not written yet. Cheap when nothing new was imported (a length
    compare); never raises (the step's work matters more than this record)."""

    def __init__(self, store: Store, run_id: str, step: str, epoch: int) -> None:
        # A fan-out's items (a loop's iterations) run the same code: the first one
        # records for the step, under its name; the others record nothing.
        group, k = task_step(step)
        self.store, self.run_id, self.step, self.epoch = store, run_id, group, epoch
        self.off = bool(k)
        self._written: set[str] = set()
        self._seen = 0

    def note(self) -> None:
        if self.off or len(sys.modules) == self._seen:
            return
        try:
            self._seen = len(sys.modules)
            new = imported_modules() - self._written
            if not new:
                return
            self.store.append_event(self.run_id, KIND, actor=Actor.WORKER, step=self.step,
                                    reason=f"the step's process imported {len(new)} more top-level modules",
                                    data={"modules": sorted(new), "epoch": self.epoch})
            self._written |= new
        except Exception:  # noqa: BLE001, S110 - a busy or full store: the next note tries again
            self._seen = 0


# -- the record in the store ----------------------------------------------------------------


def record(store: Store, run_id: str, env: Mapping[str, Any], *, at: str, actor: str, reason: str,
           extra: Mapping[str, Any] | None = None) -> Event:
    return store.append_event(run_id, KIND, actor=actor, reason=reason,
                              data={"environment": dict(env), "at": at, **dict(extra or {})})


def record_submit(store: Store, run_id: str, env: Mapping[str, Any], *, actor: str) -> Event:
    return record(store, run_id, env, at="submit", actor=actor, reason="environment recorded at submit")


@dataclass(frozen=True)
class History:
    """What a run's ``environment`` events say: the baseline and each step's imports."""

    baseline: dict[str, Any] | None  # the newest recorded environment
    baseline_at: str | None  # "submit" or "resume"
    baseline_time: float | None
    modules: dict[str, set[str]]  # step -> top-level modules its processes imported


def history(events: Iterable[Event]) -> History:
    baseline, at, when = None, None, None
    modules: dict[str, set[str]] = {}
    for e in events:
        if e.kind != KIND:
            continue
        if e.step is None and isinstance(e.data.get("environment"), dict):
            baseline, at, when = e.data["environment"], str(e.data.get("at", "submit")), e.time
        elif e.step is not None and isinstance(e.data.get("modules"), list):
            modules.setdefault(e.step, set()).update(str(m) for m in e.data["modules"])
    return History(baseline, at, when, modules)


def read_history(store: Store, run_id: str) -> History:
    return history(store.list_events(run_id, kinds=(KIND,)))


# -- the diff -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    kind: str  # "distribution" | "variable" | "python" | "platform" | "cuda" | "flow"
    name: str
    before: Any
    after: Any
    text: str
    blocking: bool = False  # refused at resume unless on_env_change is warn or allow
    steps: tuple[str, ...] = ()  # unfinished steps whose process imported the distribution

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps"] = list(self.steps)
        return d


def _variable_changed(recorded: Mapping[str, Any], salt: str, name: str, value: str | None) -> str | None:
    if not recorded.get("set"):
        return None if value is None else f"{name} now set"
    if value is None:
        return f"{name} now unset"
    return None if _same(str(recorded.get("digest", "")), salt, name, value) else f"{name} changed"


def diff(recorded: Mapping[str, Any], now: Mapping[str, Any], *, environ: Mapping[str, str] | None = None,
         imported: Mapping[str, Iterable[str]] | None = None,
         module_dists: Callable[[], Mapping[str, Sequence[str]]] = module_distributions) -> list[Change]:
    """The changes from ``recorded`` to ``now`` (both :func:`capture` records), blocking ones
    first. ``imported``: the unfinished steps' top-level modules; a change in a distribution
    that provides one of them blocks. A declared variable is compared through the recorded
    digest (its salt), with ``environ`` (default this process's) for its value now."""
    environ = os.environ if environ is None else environ
    out: list[Change] = []
    salt = str(recorded.get("salt", "00"))
    for name, entry in sorted(dict(recorded.get("variables") or {}).items()):
        text = _variable_changed(entry if isinstance(entry, dict) else {}, salt, name, environ.get(name))
        if text is not None:
            out.append(Change("variable", name, None, None, text, blocking=True))
    for name in sorted(set(dict(now.get("variables") or {})) - set(dict(recorded.get("variables") or {}))):
        out.append(Change("variable", name, None, None, f"{name} declared now, not recorded"))
    before = dict(recorded.get("distributions") or {})
    after = dict(now.get("distributions") or {})
    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    users: dict[str, set[str]] = {}
    if changed and imported:
        by_module = module_dists()
        for step, mods in imported.items():
            for mod in mods:
                for dist in by_module.get(mod, ()):
                    users.setdefault(dist, set()).add(step)
    for n in changed:
        b, a = before.get(n), after.get(n)
        text = f"{n} {b} -> {a}" if b and a else f"{n} {b} removed" if b else f"{n} {a} added"
        steps = tuple(sorted(users.get(n, ())))
        out.append(Change("distribution", n, b, a, text, blocking=bool(steps) and bool(b), steps=steps))
    rp, np_ = dict(recorded.get("python") or {}), dict(now.get("python") or {})
    for key in ("implementation", "version"):
        if rp.get(key) != np_.get(key):
            out.append(Change("python", key, rp.get(key), np_.get(key),
                              f"python {key} {rp.get(key)} -> {np_.get(key)}"))
    rpl, npl = dict(recorded.get("platform") or {}), dict(now.get("platform") or {})
    for key in ("system", "machine", "release"):
        if rpl.get(key) != npl.get(key):
            out.append(Change("platform", key, rpl.get(key), npl.get(key),
                              f"{key} {rpl.get(key)} -> {npl.get(key)}"))
    rc, nc = dict(recorded.get("cuda") or {}), dict(now.get("cuda") or {})
    for key in sorted(set(rc) | set(nc)):
        if rc.get(key) != nc.get(key):
            out.append(Change("cuda", key, rc.get(key), nc.get(key), f"cuda {key} {_short(rc.get(key))} -> "
                                                                     f"{_short(nc.get(key))}"))
    rf, nf = dict(recorded.get("flow") or {}), dict(now.get("flow") or {})
    if rf.get("digest") and nf.get("digest") and rf["digest"] != nf["digest"]:
        out.append(Change("flow", "digest", rf["digest"], nf["digest"], "the flow file changed"))
    return sorted(out, key=lambda c: not c.blocking)


def _short(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(str(x) for x in v) or "none"
    if isinstance(v, dict):
        return ", ".join(f"{k} {x}" for k, x in v.items()) or "none"
    return "none" if v is None else str(v)


# -- at resume ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResumeCheck:
    """What a resume found: the environment now, the changes, the policy that applies."""

    now: dict[str, Any]
    changes: list[Change] = field(default_factory=list)
    policy: str = "fail"
    had_baseline: bool = True

    @property
    def blocking(self) -> list[Change]:
        return [c for c in self.changes if c.blocking]

    def warning(self) -> str | None:
        """The line to warn with (None: nothing to say). Under ``allow`` the blocking
        changes are not repeated: the operator said so; the event still lists them."""
        shown = [c for c in self.changes if not (c.blocking and self.policy == "allow")]
        if not shown:
            return None
        said = "; ".join(_with_steps(c) for c in shown[:12])
        more = f"; and {len(shown) - 12} more" if len(shown) > 12 else ""
        return f"the environment changed since the run last ran: {said}{more}"


def _with_steps(c: Change) -> str:
    if not c.steps:
        return c.text
    return f"{c.text} (imported by {', '.join(c.steps[:3])}{' ...' if len(c.steps) > 3 else ''})"


def check_resume(store: Store, run: RunRecord, declared: Sequence[str], flow_path: str | os.PathLike[str], *,
                 policy: str, skip: str | None = None) -> ResumeCheck:
    """Compare the run's recorded environment with this process's; UsageError (writes nothing)
    when a blocking change meets the ``fail`` policy. ``skip``: a step this resume starts over
    (``--restart-step``); its imports do not block. A run with no record (it began before
    segue recorded environments) is not checked: the resume records one."""
    if policy not in POLICIES:
        raise UsageError(f"on_env_change must be one of {', '.join(POLICIES)}, not {policy!r}")
    hist = read_history(store, run.run_id)
    now = capture(declared, flow_path, salt=str((hist.baseline or {}).get("salt") or "") or None)
    if hist.baseline is None:
        return ResumeCheck(now=now, policy=policy, had_baseline=False)
    finished = {t.step for t in store.get_tasks(run.run_id) if str(t.state) in ("SUCCEEDED", "SKIPPED")}
    imported = {s: m for s, m in hist.modules.items() if s not in finished and s != skip}
    changes = diff(hist.baseline, now, imported=imported)
    check = ResumeCheck(now=now, changes=changes, policy=policy)
    if check.blocking and policy == "fail":
        said = "; ".join(_with_steps(c) for c in check.blocking[:8])
        more = f"; and {len(check.blocking) - 8} more" if len(check.blocking) > 8 else ""
        raise UsageError(f"resume of run {run.run_id!r} refused: its environment changed since it "
                         f"last ran: {said}{more}; see `segue env {run.run_id}`, or pass "
                         f"--on-env-change warn (or allow) to resume anyway")
    return check


def record_resume(store: Store, run_id: str, check: ResumeCheck, *, actor: str) -> Event | None:
    """The environment this resume goes on in becomes the run's baseline (an event that
    lists what changed and the policy that let it), when anything changed; None if not."""
    if check.had_baseline and not check.changes:
        return None
    if not check.had_baseline:
        reason = "environment recorded at resume (the run had no record)"
    else:
        allowed = (f" (let through by on_env_change={check.policy})" if check.blocking else "")
        reason = ("environment changed since the run last ran" + allowed + ": "
                  + "; ".join(_with_steps(c) for c in check.changes[:12])
                  + (f"; and {len(check.changes) - 12} more" if len(check.changes) > 12 else ""))
    return record(store, run_id, check.now, at="resume", actor=actor, reason=reason,
                  extra={"changes": [c.to_json() for c in check.changes], "policy": check.policy,
                         "warning": check.warning()})


# -- `segue env` -----------------------------------------------------------------------------


def public(env: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A record as shown (`segue env`, the API, the run page): no salt."""
    if env is None:
        return None
    return {k: v for k, v in env.items() if k != "salt"}


def report(store: Store, run: RunRecord) -> dict[str, Any]:
    """The recorded environment, each step's imported distributions, and the diff to this
    process's environment now (what a resume would say, under the run's policy)."""
    hist = read_history(store, run.run_id)
    declared = list(dict((hist.baseline or {}).get("variables") or {}))
    policy = str(run.options.get("on_env_change", "fail"))
    by_module = module_distributions() if hist.modules else {}
    imported = {step: sorted({d for m in mods for d in by_module.get(m, ())})
                for step, mods in sorted(hist.modules.items())}
    now = capture(declared, run.flow_path, salt=str((hist.baseline or {}).get("salt") or "") or None)
    changes: list[Change] = []
    if hist.baseline is not None:
        finished = {t.step for t in store.get_tasks(run.run_id) if str(t.state) in ("SUCCEEDED", "SKIPPED")}
        changes = diff(hist.baseline, now, imported={s: m for s, m in hist.modules.items() if s not in finished},
                       module_dists=lambda: by_module)
    return {"run_id": run.run_id, "policy": policy, "recorded_at": hist.baseline_at,
            "recorded_time": hist.baseline_time, "recorded": public(hist.baseline),
            "imported": imported, "now": public(now),
            "changes": [c.to_json() for c in changes],
            "would_refuse": bool(any(c.blocking for c in changes) and policy == "fail")}


def describe(rec: dict[str, Any], imported: dict[str, list[str]], *, show_all: bool = False) -> list[str]:
    """The recorded environment as lines (`segue env` and the run page)."""
    py = rec.get("python") or {}
    plat = rec.get("platform") or {}
    dists = rec.get("distributions") or {}
    out = [f"python {py.get('implementation', '?')} {py.get('version', '?')} ({py.get('executable', '?')})",
           f"platform {plat.get('system', '?')} {plat.get('release', '')} {plat.get('machine', '')}".rstrip()]
    cuda = rec.get("cuda")
    if cuda:
        runtime = ", ".join(f"{k} {v}" for k, v in (cuda.get("runtime") or {}).items())
        out.append(f"cuda driver {cuda.get('driver', '-')} (CUDA {cuda.get('driver_cuda', '-')})"
                   f"{'  runtime ' + runtime if runtime else ''}"
                   f"{'  gpus ' + ', '.join(cuda['gpus']) if cuda.get('gpus') else ''}")
    else:
        out.append("cuda none")
    flow = rec.get("flow") or {}
    out.append(f"flow {flow.get('path')} {flow.get('digest') or ''}".rstrip())
    for name, v in (rec.get("variables") or {}).items():
        if not v.get("set"):
            shown = "unset"
        elif v.get("secret"):
            shown = "(secret) " + str(v.get("digest", ""))[:24] + "…"
        else:
            shown = repr(v["value"]) if "value" in v else str(v.get("digest", ""))[:24] + "…"
        out.append(f"${name} {shown}")
    same: dict[tuple[str, ...], list[str]] = {}  # a fan-out's 10,000 tasks: one line per import set
    for step, names in imported.items():
        same.setdefault(tuple(names), []).append(step)
    for group, steps in same.items():
        have = [f"{n} {dists.get(n, '?')}" for n in group]
        who = (f"step {steps[0]}" if len(steps) == 1 else
               f"steps {', '.join(steps[:3])}{f' and {len(steps) - 3} more' if len(steps) > 3 else ''}")
        out.append(f"{who} imported {len(have)} distributions: {', '.join(have) or 'none'}")
    out.append(f"{len(dists)} distributions installed" + (":" if show_all else ""))
    if show_all:
        out += [f"  {n} {v}" for n, v in dists.items()]
    return out
