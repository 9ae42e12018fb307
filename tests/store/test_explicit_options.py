"""Options reach segue's own processes explicitly, never through the environment (issue 36).

``segue --store URL`` is given to the CLI only: its controller (a detached one too)
and the controller's workers and gang ranks must use that store although no
``SEGUE_STORE`` is set anywhere, and segue adds no ``SEGUE_*`` variable to any
process it starts. Needs the throwaway PostgreSQL server (tests/pgserver.py); skips
and says why without it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue import checkpoint as ckpt
from segue.home import Home

ENVSEE = str(FLOWS / "envsee.py")


@pytest.fixture
def pg_url(new_target: Callable[[str], str]) -> str:
    return new_target("postgres")


def _output(home: Home, run: str, step: str) -> Any:
    store = home.open_store()
    ref = store.get_task(run, step).output_ref
    return ckpt.load(home.run_storage(store.get_run(run)), ref).state["value"]


@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detached"])
def test_store_flag_reaches_controller_workers_and_ranks_without_the_environment(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, detach: bool) -> None:
    monkeypatch.delenv("SEGUE_STORE", raising=False)
    segue = Segue(tmp_path / "home")
    segue.env.pop("SEGUE_STORE", None)
    segue.env.pop("SEGUE_HOST_ID", None)
    run = "explicit"
    proc = segue("--store", pg_url, "run", ENVSEE, "--run-id", run, *(["--detach"] if detach else []))
    assert proc.returncode == 0, proc.stderr
    home = Home.resolve(segue.home, store=pg_url)
    store = home.open_store()
    wait_for(lambda: store.get_run(run).state.value in ("SUCCEEDED", "FAILED"), 120, "the run to end")
    assert store.get_run(run).state.value == "SUCCEEDED", segue("--store", pg_url, "events", run).stdout
    # Not in the home's SQLite file: only the flag named the database.
    alone = segue("status", run)
    assert alone.returncode == 2 and alone.stderr.startswith(f"segue: unknown run '{run}'"), alone.stderr
    # segue set nothing for its processes: they see exactly the CLI's own SEGUE_* settings.
    mine = sorted(k for k in segue.env if k.startswith("SEGUE_") and not k.startswith("SEGUE_FAULTS"))
    for step in ("plain", "ranks"):
        got = _output(home, run, step)
        assert got["env"] == mine, (step, got["env"], mine)
        assert got["explicit_store"] is True, step


def test_agent_host_id_reaches_its_process_without_the_environment(tmp_path: Path) -> None:
    """The host name is a value handed on (hostname.use_host), never exported."""
    import os
    import subprocess
    import sys

    code = ("import os, socket\n"
            "from segue.hostname import given_host, this_host, use_host\n"
            "assert this_host() == socket.gethostname() and given_host() is None\n"
            "use_host('B')\n"
            "assert this_host() == 'B' and given_host() == 'B'\n"
            "assert 'SEGUE_HOST_ID' not in os.environ\n")
    env = {k: v for k, v in os.environ.items() if k != "SEGUE_HOST_ID"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
