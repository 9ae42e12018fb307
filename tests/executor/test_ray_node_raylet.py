"""An attempt's actor tells a lost node from a worker killed on a healthy one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

ACTOR = textwrap.dedent("""
    import sys
    from segue.executor.ray_node import AttemptActor
    actor = AttemptActor()  # its parent stands for the node's raylet
    print("alive", actor._raylet_gone(0.2), flush=True)
    sys.stdin.readline()  # EOF once the parent is gone
    print("gone", actor._raylet_gone(10.0), flush=True)
""")

RAYLET = textwrap.dedent("""
    import os, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE,
                             stdout=open(sys.argv[2], "w"))
    sys.stdin.readline()  # the test says when this "raylet" ends
    os._exit(0)  # without closing or waiting: the child is orphaned, as when a raylet dies
""")


def test_the_actor_sees_its_raylet_end(tmp_path: Path) -> None:
    out = tmp_path / "actor.out"
    raylet = subprocess.Popen([sys.executable, "-c", RAYLET, ACTOR, str(out)], stdin=subprocess.PIPE)
    try:
        for _ in range(200):  # the first answer comes once the actor waited 0.2 s
            if out.exists() and "alive" in out.read_text():
                break
            time.sleep(0.05)
        assert out.read_text().splitlines() == ["alive False"]  # its raylet lives
        assert raylet.stdin is not None
        raylet.stdin.write(b"go\n")
        raylet.stdin.close()
        assert raylet.wait(30) == 0
        for _ in range(400):
            if "gone" in out.read_text():
                break
            time.sleep(0.05)
        assert out.read_text().splitlines() == ["alive False", "gone True"]
    finally:
        if raylet.poll() is None:
            raylet.kill()
