"""What a new user meets first: `segue resume`'s output, `segue run --help`, and
`segue ckpt` pointed at a home's storage directory. Real CLI processes, a temp home."""

from __future__ import annotations

import re
from pathlib import Path

from segue_helpers import FLOWS, Segue, wait_for

COUNTER = str(FLOWS / "counter.py")


def test_resume_prints_only_what_happens_after_it_and_no_pruned_lines(segue: Segue, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    segue("run", COUNTER, "--run-id", "r", "-p", "n=30", "-p", f"hold={hold}", "--detach", check=True)
    wait_for(lambda: segue.step("r", "count")["last_checkpoint"], 60, "a first checkpoint")
    assert segue("pause", "r", "--wait", "--timeout", "60").returncode == 0
    before = segue.events("r")
    resume = segue.popen("resume", "r")
    try:
        # The held last iteration commits twice a second: wait until this resume's
        # attempt pruned a checkpoint (retention keeps 3), so the output had one to print.
        wait_for(lambda: any(e["kind"] == "checkpoint" and e["to_state"] == "pruned"
                             and e["id"] > before[-1]["id"] for e in segue.events("r")),
                 60, "a checkpoint pruned after the resume")
        hold.touch()
        out, err = resume.communicate(timeout=120)
    finally:
        resume.kill()
    assert resume.returncode == 0, err
    lines = out.splitlines()
    assert lines[-1] == "run r SUCCEEDED"
    assert "(resume requested)" in lines[0], out
    assert "(run created)" not in out and "count: task PENDING -> RUNNING (attempt 1 " not in out, out
    assert "pruned" not in out, out
    # Those lines are still in the run's history.
    assert any(e["to_state"] == "pruned" for e in segue.events("r"))


def _entries_without_help(text: str) -> list[str]:
    """The option and argument entries of an argparse help text that have no description."""
    lines = text.splitlines()
    bare = []
    section = False
    for i, line in enumerate(lines):
        if line.endswith(":") and not line.startswith(" "):
            section = line in ("options:", "positional arguments:")
            continue
        if not section or not re.match(r"^  \S", line):
            continue
        same_line = re.match(r"^  \S.*?\s{2,}\S", line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if not same_line and not re.match(r"^ {3,}\S", nxt) and not line.startswith("  -h, --help"):
            bare.append(line.strip())
    return bare


def test_every_option_of_run_and_resume_has_help(segue: Segue) -> None:
    for cmd in ("run", "resume"):
        proc = segue(cmd, "--help")
        assert proc.returncode == 0, proc.stderr
        assert _entries_without_help(proc.stdout) == [], proc.stdout


def test_ckpt_commands_on_the_homes_storage_directory(segue: Segue) -> None:
    for run in ("a", "b"):
        segue("run", COUNTER, "--run-id", run, "-p", "n=30", check=True)
    committed = sorted(c["path"] for run in ("a", "b") for c in segue.json("checkpoints", run)
                       if c["status"] == "committed")
    assert committed and {p.split("/")[1] for p in committed} == {"a", "b"}
    data = segue.home / "data"  # where runs keep checkpoints by default
    proc = segue("ckpt", "ls", str(data))
    assert proc.returncode == 0, proc.stderr
    assert sorted(line.split()[0] for line in proc.stdout.splitlines()) == committed
    assert sorted(r["path"] for r in segue.json("ckpt", "ls", str(data))) == committed  # one array
    assert segue("ckpt", "ls", str(data / "runs" / "b")).stdout.count("runs/b/count/ckpt/") == \
        sum(p.startswith("runs/b/") for p in committed)
    ver = segue("ckpt", "verify", str(data))
    assert ver.returncode == 0 and sorted(x.split()[1] for x in ver.stdout.splitlines()) == committed, ver
    # By hand, prune takes one step's directory: the runs' own retention prunes these.
    pr = segue("ckpt", "prune", str(data), "--keep-last", "1")
    assert pr.returncode == 2 and pr.stdout == "", pr
    assert pr.stderr.strip() == (f"segue: {data} holds runs' checkpoints, pruned by their steps' "
                                 "keep_checkpoints; pass one step's directory (runs/RUN/STEP/ckpt) "
                                 "to prune by hand")
    assert sorted(line.split()[0] for line in segue("ckpt", "ls", str(data)).stdout.splitlines()) == committed
    # The help says where a run's checkpoints are.
    assert "HOME/data" in " ".join(segue("ckpt", "ls", "--help").stdout.split())
