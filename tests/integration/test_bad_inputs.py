"""An audit of every input path: bad input through the real CLI.

Each case runs `segue` as a user would and asserts the contract of bad
input: the documented exit code (2 unless noted), exactly one line on
stderr, no traceback, and nothing written (a fresh home is not created; an
existing home's files and database rows are unchanged).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from segue_helpers import FLOWS, Segue

COUNTER = str(FLOWS / "counter.py")
HEAD = "from segue import Flow\nflow = Flow('f')\n"
STEP = "@flow.step\ndef a(ctx):\n    return 1\n"

# name -> source of a flow file the cases below refer to as "@name"
SOURCES: dict[str, str | bytes] = {
    "syntax": "def broken(:\n",
    "nulls": b"from segue import Flow\x00\n",
    "latin1": b"x = '\xff\xfe'\n",
    "noflow": "x = 1\n",
    "twoflows": "from segue import Flow\na = Flow('a')\nb = Flow('b')\n",
    "nosteps": HEAD,
    "cycle": HEAD + "@flow.step(after=['b'])\ndef a(ctx): pass\n@flow.step(after=[a])\ndef b(ctx): pass\n",
    "ghost": HEAD + "@flow.step(after=['ghost'])\ndef a(ctx): pass\n",
    "raises": "raise RuntimeError('boom at import')\n",
    "exit0": "import sys\nsys.exit(0)\n",
    "exit3": "import sys\nsys.exit(3)\n",
    "kbint": "raise KeyboardInterrupt\n",
    "retries": HEAD + "@flow.step(retries=-1)\ndef a(ctx): pass\n",
    "cpus0": HEAD + "@flow.step(cpus=0)\ndef a(ctx): pass\n",
    "cpusnan": HEAD + "@flow.step(cpus=float('nan'))\ndef a(ctx): pass\n",
    "gpusneg": HEAD + "@flow.step(gpus=-1)\ndef a(ctx): pass\n",
    "gpusfrac": HEAD + "@flow.step(gpus=1.5)\ndef a(ctx): pass\n",
    "every": HEAD + "@flow.step(checkpoint_every='soon')\ndef a(ctx): pass\n",
    "everynan": HEAD + "@flow.step(checkpoint_every=float('nan'))\ndef a(ctx): pass\n",
    "everyinf": HEAD + "@flow.step(checkpoint_every=float('inf'))\ndef a(ctx): pass\n",
    "steps0": HEAD + "@flow.step(checkpoint_every_steps=0)\ndef a(ctx): pass\n",
    "keep0": HEAD + "@flow.step(keep_checkpoints=0)\ndef a(ctx): pass\n",
    "memory": HEAD + "@flow.step(memory='lots')\ndef a(ctx): pass\n",
    "memneg": HEAD + "@flow.step(memory=-5)\ndef a(ctx): pass\n",
    "twice": HEAD + STEP + STEP,
    "flowname": "from segue import Flow\nflow = Flow('bad name')\n" + STEP,
    "paramname": "from segue import Flow\nflow = Flow('f', params={'a-b': 1})\n" + STEP,
    "paramtype": "from segue import Flow\nflow = Flow('f', params={'s': {1, 2}})\n" + STEP,
    "paramnan": "from segue import Flow\nflow = Flow('f', params={'x': float('nan')})\n" + STEP,
    "paramobj": "from segue import Flow\nflow = Flow('f', params={'xs': [object()]})\n" + STEP,
    "workers0": HEAD + "@flow.map(source=[], sink=[], workers=0)\ndef m(r): return r\n",
    "workersneg": HEAD + "@flow.map(source=[], sink=[], workers=-2)\ndef m(r): return r\n",
    "batch0": HEAD + "@flow.map(source=[], sink=[], batch_size=0)\ndef m(r): return r\n",
    "rate2": HEAD + "@flow.map(source=[], sink=[], max_failure_rate=2)\ndef m(r): return r\n",
    "maxfail": HEAD + "@flow.map(source=[], sink=[], max_failures=-1)\ndef m(r): return r\n",
    "kind": HEAD + "@flow.map(source=[], sink=[], kind='reduce')\ndef m(r): return r\n",
    "nosource": HEAD + "@flow.map(source=None, sink=[])\ndef m(r): return r\n",
    "typed": "from segue import Flow\nflow = Flow('typed', params={'xs': [1], 'd': {}, 'flag': False, "
             "'x': 0.5, 'n': 1, 's': ''})\n" + STEP,
}


@dataclass
class Case:
    args: list[str | bytes]
    code: int = 2
    home: bool = False  # run against a home that already holds a finished run "done"
    env: dict[str, str] = field(default_factory=dict)
    codes: tuple[int, ...] = ()  # when another command owns the exact code


def run_(*args: str | bytes, **kw) -> Case:
    return Case(["run", *args], **kw)


CASES: dict[str, Case] = {
    # flow files
    "missing-file": run_("@/nope.py"),
    "directory": run_("@/"),
    "syntax": run_("@syntax"),
    "null-bytes": run_("@nulls"),
    "not-utf8": run_("@latin1"),
    "no-flow": run_("@noflow"),
    "two-flows": run_("@twoflows"),
    "no-steps": run_("@nosteps"),
    "cycle": run_("@cycle"),
    "unknown-upstream": run_("@ghost"),
    "raises-on-import": run_("@raises"),
    "sys-exit-0-on-import": run_("@exit0"),
    "sys-exit-3-on-import": run_("@exit3"),
    "keyboard-interrupt-on-import": run_("@kbint", code=130),
    # declarations
    "retries-negative": run_("@retries"),
    "cpus-zero": run_("@cpus0"),
    "cpus-nan": run_("@cpusnan"),
    "gpus-negative": run_("@gpusneg"),
    "gpus-fraction": run_("@gpusfrac"),
    "checkpoint-every-word": run_("@every"),
    "checkpoint-every-nan": run_("@everynan"),
    "checkpoint-every-inf": run_("@everyinf"),
    "checkpoint-every-steps-0": run_("@steps0"),
    "keep-checkpoints-0": run_("@keep0"),
    "memory-word": run_("@memory"),
    "memory-negative": run_("@memneg"),
    "step-declared-twice": run_("@twice"),
    "flow-name": run_("@flowname"),
    "param-name": run_("@paramname"),
    "param-type": run_("@paramtype"),
    "param-default-nan": run_("@paramnan"),
    "param-default-not-json": run_("@paramobj"),
    "map-workers-0": run_("@workers0"),
    "map-workers-negative": run_("@workersneg"),
    "map-batch-size-0": run_("@batch0"),
    "map-failure-rate-2": run_("@rate2"),
    "map-max-failures-negative": run_("@maxfail"),
    "map-kind": run_("@kind"),
    "map-no-source": run_("@nosource"),
    # parameters
    "param-int-word": run_(COUNTER, "-p", "n=lots"),
    "param-int-float": run_(COUNTER, "-p", "n=1.5"),
    "param-unknown": run_(COUNTER, "-p", "m=1"),
    "param-no-equals": run_(COUNTER, "-p", "n"),
    "param-no-name": run_(COUNTER, "-p", "=5"),
    "param-float-nan": run_(COUNTER, "-p", "sleep=nan"),
    "param-float-inf": run_(COUNTER, "-p", "sleep=inf"),
    "param-float-minus-inf": run_(COUNTER, "-p", "sleep=-Infinity"),
    "param-list-nan": run_("@typed", "-p", "xs=[NaN]"),
    "param-dict-infinity": run_("@typed", "-p", 'd={"a": Infinity}'),
    "param-list-not-json": run_("@typed", "-p", "xs=[1,"),
    "param-list-given-dict": run_("@typed", "-p", 'xs={"a": 1}'),
    "param-bool-word": run_("@typed", "-p", "flag=maybe"),
    "param-str-undecodable": run_("@typed", "-p", b"s=\xff\xfe"),
    "param-deep-json": run_("@typed", "-p", "xs=" + "[" * 20_000 + "]" * 20_000),
    # run options
    "run-id-slash": run_(COUNTER, "--run-id", "a/b"),
    "run-id-trailing-newline": run_(COUNTER, "--run-id", "r1\n"),
    "run-id-dot-start": run_(COUNTER, "--run-id", ".hidden"),
    "run-id-dotdot": run_(COUNTER, "--run-id", "a..b"),
    "run-id-too-long": run_(COUNTER, "--run-id", "r" * 65),
    "run-id-empty": run_(COUNTER, "--run-id", ""),
    "run-id-exists": run_(COUNTER, "--run-id", "done", home=True),
    "priority-word": run_(COUNTER, "--priority", "asap"),
    "gpus-option-negative": run_(COUNTER, "--gpus", "-3"),
    "gpu-mem-word": run_(COUNTER, "--gpu-mem", "lots"),
    "max-pause-word": run_(COUNTER, "--max-pause", "soon"),
    "max-pause-nan": run_(COUNTER, "--max-pause", "nan"),
    "pause-deadline-negative": run_(COUNTER, "--pause-deadline", "-1"),
    "pause-deadline-nan": run_(COUNTER, "--pause-deadline", "nan"),
    "pause-deadline-inf": run_(COUNTER, "--pause-deadline", "inf"),
    "on-input-change-word": run_(COUNTER, "--on-input-change", "ignore"),
    "env-lease-ttl-word": run_(COUNTER, env={"SEGUE_LEASE_TTL_S": "long"}),
    "env-lease-ttl-nan": run_(COUNTER, env={"SEGUE_LEASE_TTL_S": "nan"}),
    "env-lease-ttl-tiny": run_(COUNTER, env={"SEGUE_LEASE_TTL_S": "0.01"}),
    "home-is-a-file": Case(["--home", "@file", "run", COUNTER]),
    "home-under-a-file": Case(["--home", "@file/sub", "run", COUNTER]),
    # the command line itself
    "no-command": Case([]),
    "unknown-command": Case(["frobnicate"]),
    "unknown-flag": run_(COUNTER, "--frobnicate"),
    "missing-argument": Case(["status"]),
    # commands on runs
    "status-no-home": Case(["status", "x"]),
    "status-unknown": Case(["status", "ghost"], home=True),
    "status-newline-id": Case(["status", "done\n"], home=True),
    "events-unknown": Case(["events", "ghost"], home=True),
    "checkpoints-unknown": Case(["checkpoints", "ghost"], home=True),
    "pause-unknown": Case(["pause", "ghost"], home=True),
    "pause-finished": Case(["pause", "done"], home=True),
    "pause-timeout-word": Case(["pause", "done", "--wait", "--timeout", "soon"], home=True),
    "resume-unknown": Case(["resume", "ghost"], home=True),
    "resume-succeeded": Case(["resume", "done"], home=True),
    "cancel-unknown": Case(["cancel", "ghost"], home=True),
    "cancel-succeeded": Case(["cancel", "done"], home=True),
    "resume-no-home": Case(["resume", "x"]),
    # verify
    "verify-missing-flow": Case(["verify", "@/nope.py"]),
    "verify-kills-negative": Case(["verify", COUNTER, "--kills", "-1"]),
    "verify-min-faults-too-many": Case(["verify", COUNTER, "--kills", "1", "--pauses", "0",
                                        "--min-faults", "5"]),
    "verify-keep-not-empty": Case(["verify", COUNTER, "--keep", "@full"]),
    "verify-param": Case(["verify", COUNTER, "-p", "n=x"]),
    "verify-param-nan": Case(["verify", COUNTER, "-p", "sleep=nan"]),
    # the commands of other parts of segue
    "ckpt-now-unknown": Case(["ckpt", "now", "ghost"], home=True),
    "output-unknown-run": Case(["output", "ghost", "count"], home=True),
    "output-unknown-step": Case(["output", "done", "ghost"], home=True),
    "logs-unknown-run": Case(["logs", "ghost"], home=True),
    "logs-attempt-word": Case(["logs", "done", "count", "--attempt", "two"], home=True),
    "prices-set-word": Case(["prices", "set", "h100", "cheap"], home=True),
    "prices-set-nan": Case(["prices", "set", "h100", "nan"], home=True),
    "prices-set-negative": Case(["prices", "set", "h100", "-3"], home=True),
    "status-price-word": Case(["status", "done", "--price", "h100=cheap"], home=True),
    "ckpt-prune-keep-negative": Case(["ckpt", "prune", "@/missing", "--keep-last", "-1"]),
    # checkpoints (1 or 2: the checkpoint commands document "nothing found" as 1)
    "ckpt-verify-missing-path": Case(["ckpt", "verify", "@/missing"], codes=(1, 2)),
    "ckpt-ls-missing-path": Case(["ckpt", "ls", "@/missing"], codes=(1, 2)),
}


@pytest.fixture(scope="module")
def finished_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("finished") / "home"
    Segue(home)("run", COUNTER, "--run-id", "done", "-p", "n=3", "-p", "sleep=0", check=True)
    return home


def fingerprint(home: Path) -> dict[str, str]:
    """Every file's content, and the database's rows (its files change on a mere read)."""
    if not home.exists():
        return {}
    out = {}
    for p in sorted(home.rglob("*")):
        if p.is_file() and not p.name.startswith("segue.db"):
            out[str(p.relative_to(home))] = hashlib.sha256(p.read_bytes()).hexdigest()
    conn = sqlite3.connect(f"file:{home / 'segue.db'}?mode=ro", uri=True)
    try:
        out["segue.db"] = hashlib.sha256("\n".join(conn.iterdump()).encode()).hexdigest()
    finally:
        conn.close()
    return out


def _listing(tmp: Path) -> list[str]:
    # pool.db is the host-wide device pool (conftest points SEGUE_POOL here):
    # `status` may create it empty, as any command that looks at devices.
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("pool.db"))


def expand(arg: str | bytes, tmp: Path, resolve: Callable[[str], str]) -> str | bytes:
    if isinstance(arg, bytes) or not arg.startswith("@"):
        return arg
    if arg.startswith("@/"):
        return str(tmp / arg[2:]) if arg != "@/" else str(tmp)
    if arg == "@full":
        (tmp / "full").mkdir()
        (tmp / "full" / "precious.txt").write_text("keep me\n")
        return str(tmp / "full")
    if arg.startswith("@file"):
        f = tmp / "a-file"
        f.write_text("not a directory\n")
        return str(f) + arg[len("@file"):]
    return resolve(arg[1:])


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_and_writes_nothing(name: str, tmp_path: Path, finished_home: Path) -> None:
    case = CASES[name]
    home = tmp_path / "home"
    if case.home:
        shutil.copytree(finished_home, home)
    segue = Segue(home)

    def flow_file(key: str) -> str:
        p = tmp_path / f"{key}.py"
        src = SOURCES[key]
        p.write_bytes(src if isinstance(src, bytes) else src.encode())
        return str(p)

    args = [expand(a, tmp_path, flow_file) for a in case.args]
    before = fingerprint(home)
    listing = _listing(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "segue", *args], capture_output=True,
                          env={**segue.env, **case.env}, timeout=120, cwd=tmp_path)
    err = proc.stderr.decode("utf-8", "replace")
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert lines[0].startswith("segue: "), lines[0]
    assert not re.match(r"[A-Z][a-z]", lines[0][len("segue: "):]), f"not lower-case: {lines[0]}"
    assert proc.returncode in (case.codes or (case.code,)), (proc.returncode, err)
    assert fingerprint(home) == before, "bad input must not change the home"
    if not case.home:
        assert not home.exists(), "bad input must not create the home"
    assert _listing(tmp_path) == listing, "nothing else may be written"
