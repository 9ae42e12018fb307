"""Choosing an executor: the run option, its validation, and what travels to a Ray node.

No Ray cluster here (tests/executor/test_ray_executor.py has one): these are the
checks that need none, and they must hold even where Ray is not installed.
"""

from __future__ import annotations

import pytest
from segue_helpers import FLOWS, Segue

from segue.errors import UsageError
from segue.executor import LocalProcessExecutor, executor_for
from segue.executor.ray import forwarded_env
from segue.run.options import RunOptions


def test_the_executor_is_a_stored_run_option_with_a_clear_error() -> None:
    assert RunOptions().executor == "local"
    assert RunOptions.from_env().executor == "local"
    with pytest.raises(UsageError, match="run option executor must be one of local, ray, not 'k8s'"):
        RunOptions(executor="k8s")
    with pytest.raises(UsageError, match="run option ray_address must be a path or URL"):
        RunOptions(ray_address=5)  # type: ignore[arg-type]
    opts = RunOptions.from_json(RunOptions(executor="ray", ray_address="10.0.0.1:6379").to_json())
    assert (opts.executor, opts.ray_address) == ("ray", "10.0.0.1:6379")
    assert isinstance(executor_for("local"), LocalProcessExecutor)
    assert type(executor_for("ray", "10.0.0.1:6379")).__name__ == "RayExecutor"  # connects lazily


def test_a_worker_on_ray_gets_segue_settings_and_named_variables_only() -> None:
    env = {"PATH": "/usr/bin", "HOME": "/root", "API_TOKEN": "secret", "HF_HOME": "/cache",
           "SEGUE_LEASE_TTL_S": "30", "SEGUE_HOME": "/here/.segue", "SEGUE_RAY_ENV": "HF_HOME, MISSING"}
    assert forwarded_env(env) == {"SEGUE_LEASE_TTL_S": "30", "SEGUE_RAY_ENV": "HF_HOME, MISSING",
                                  "HF_HOME": "/cache"}


def test_an_unknown_executor_on_the_command_line_is_refused(segue: Segue) -> None:
    proc = segue("run", str(FLOWS / "counter.py"), "--executor", "k8s")
    assert proc.returncode == 2 and "invalid choice: 'k8s'" in proc.stderr, proc.stderr
    proc = segue("run", str(FLOWS / "counter.py"), env={"SEGUE_EXECUTOR": "k8s"})
    assert proc.returncode == 2, proc.stderr
    assert "run option executor must be one of local, ray, not 'k8s'" in proc.stderr, proc.stderr
