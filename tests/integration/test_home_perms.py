"""The home is private to its owner: run parameters, logs and tokens live there."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from segue_helpers import FLOWS, Segue

COUNTER = str(FLOWS / "counter.py")


def _segue(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI under the common umask 022 (what makes files world-readable by default)."""
    env = {**Segue(home).env}
    return subprocess.run([sys.executable, "-m", "segue", *args], env=env, capture_output=True,
                          text=True, timeout=300, preexec_fn=lambda: os.umask(0o022))


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_new_home_is_0700_under_umask_022(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = _segue(home, "run", COUNTER, "--run-id", "r", "-p", "n=30", "-p", "sleep=0")
    assert proc.returncode == 0, proc.stderr
    assert mode(home) == 0o700
    assert mode(home / "segue.db") == 0o600
    entries = list(home.rglob("*"))
    assert len(entries) > 5  # a real run wrote logs, checkpoints and outputs
    # Whatever mode the entries got from the umask, nobody else can reach them:
    # every path to them goes through the home, which others cannot enter.
    assert mode(home) & 0o077 == 0
    for p in home.glob("segue.db*"):
        assert mode(p) & 0o077 == 0, p


def test_existing_home_of_ours_is_tightened_when_opened(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert _segue(home, "run", COUNTER, "--run-id", "r", "-p", "n=3", "-p", "sleep=0").returncode == 0
    os.chmod(home, 0o755)  # as an older segue (or a umask) left it
    os.chmod(home / "segue.db", 0o644)
    proc = _segue(home, "ls")
    assert proc.returncode == 0, proc.stderr
    assert mode(home) == 0o700
    assert mode(home / "segue.db") == 0o600


def test_a_sticky_shared_folder_given_as_home_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # shared by design, like /tmp
    (shared / "notes.txt").write_text("not segue's\n")
    proc = _segue(shared, "run", COUNTER, "--run-id", "r", "-p", "n=3", "-p", "sleep=0")
    assert proc.returncode == 0, proc.stderr
    assert mode(shared) == 0o1777  # not segue's to lock
    assert mode(shared / "segue.db") == 0o600  # but the database is private all the same
