"""The import graph keeps its layers: `lint-imports` (import-linter) over pyproject's contracts.

Run as a test so CI (`make test`) fails on an import that points up a layer or closes
a circle among a package's modules, function-local imports included.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports() -> str:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("import-linter is not installed: `make install-dev` installs it (pip install import-linter)")
    return exe


def test_imports_point_down_the_layers_and_close_no_circle() -> None:
    r = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "2 kept, 0 broken" in r.stdout, r.stdout[-2000:]


def test_the_contract_catches_an_upward_import(tmp_path: Path) -> None:
    """The check can fail: the same contracts over a copy of the package with one
    upward import added (the placement layer importing the client) are broken."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "segue", src / "segue", ignore=shutil.ignore_patterns("__pycache__"))
    policy = src / "segue" / "placement" / "policy.py"
    policy.write_text(policy.read_text() + "\n\ndef _up() -> None:\n    from ..client import base  # noqa: F401\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    r = subprocess.run([_lint_imports(), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(src), "PATH": str(Path(sys.executable).parent)})
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert "segue.placement is not allowed to import segue.client" in r.stdout, r.stdout[-3000:]
