"""Helpers for tests that drive segue through real processes (imported by conftest and tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

FLOWS = Path(__file__).parent / "flows"
T = TypeVar("T")


def flow_module(name: str) -> Any:
    """The test flow ``tests/flows/NAME.py`` as a module, for its helpers (an expected
    result): loaded from its file, as segue loads a flow, under a name of its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_flow_{name}", FLOWS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Segue:
    """Runs the real `segue` CLI against one home directory."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "SEGUE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.env.pop("SEGUE_FAULTS", None)

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
                 check: bool = False) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "segue", *args], capture_output=True, text=True,
                              env={**self.env, **(env or {})}, timeout=timeout)
        if check and proc.returncode not in (0, 3):
            raise AssertionError(f"segue {args} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "segue", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**self.env, **(env or {})})

    def status(self, run_id: str) -> dict[str, Any]:
        proc = self("status", run_id, "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def json(self, *args: str) -> Any:
        proc = self(*args, "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def step(self, run_id: str, name: str) -> dict[str, Any]:
        return next(s for s in self.status(run_id)["steps"] if s["name"] == name)

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return json.loads(self("events", run_id, "--json").stdout)

    def output(self, run_id: str, step: str) -> Any:
        from segue.home import Home

        home = Home.resolve(self.home)
        # The store this CLI's processes use: $SEGUE_STORE as in self.env, not this process's.
        with mock.patch.dict(os.environ, clear=False):
            os.environ.pop("SEGUE_STORE", None)
            if self.env.get("SEGUE_STORE"):
                os.environ["SEGUE_STORE"] = self.env["SEGUE_STORE"]
            store = home.open_store()
        from segue.run.stepio import load_output

        ref = store.get_task(run_id, step).output_ref
        return load_output(store, home.run_storage(store.get_run(run_id)), run_id, step, ref,
                           allow_pickle=False)

    def wait_state(self, run_id: str, states: set[str], timeout: float = 60) -> dict[str, Any]:
        seen: list[str] = []  # the states passed through, for the message on a timeout

        def reached() -> dict[str, Any] | None:
            d = self.status(run_id)
            if not seen or seen[-1] != d["state"]:
                seen.append(d["state"])
            return d if d["state"] in states else None

        try:
            return wait_for(reached, timeout, f"run {run_id} to reach {states}")
        except AssertionError as e:
            raise AssertionError(f"{e} (states seen: {' -> '.join(seen)})") from None


def wait_for(pred: Callable[[], T], timeout: float = 60, what: str = "condition",
             poll: float = 0.02) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class VirtualClock:
    """A wall clock that moves only when told (Trio's MockClock, for leases).

    In process, pass the instance as ``clock=``. Across processes, ``env``
    arms ``SEGUE_CLOCK_FILE``: every segue process of a test reads the offset
    this object writes, so advancing it expires leases everywhere at once
    without the test sleeping against them.
    """

    def __init__(self, path: Path | None = None, start: float = 1_000_000.0) -> None:
        self.path = path
        self.offset = 0.0
        self.start = start
        if path is not None:
            self._write()

    def __call__(self) -> float:
        if self.path is not None:  # shared with other processes: real time plus the offset
            return time.time() + self.offset
        return self.start + self.offset

    @property
    def env(self) -> dict[str, str]:
        assert self.path is not None, "give VirtualClock a path to share it with other processes"
        return {"SEGUE_CLOCK_FILE": str(self.path)}

    def advance(self, seconds: float) -> None:
        self.offset += seconds
        if self.path is not None:
            self._write()

    def _write(self) -> None:
        assert self.path is not None
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(repr(self.offset))
        os.replace(tmp, self.path)  # readers see the old offset or the new, never half
