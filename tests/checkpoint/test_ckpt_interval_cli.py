"""The interval policy (fake clock, no sleeps), the ckpt CLI handlers, the manager."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pytest

from segue.checkpoint import (
    CheckpointManager,
    IntervalPolicy,
    LocalStorage,
    parse_duration,
    read_manifest,
    save,
)
from segue.cli import ckpt as cli


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_parse_duration() -> None:
    assert [parse_duration(x) for x in ("30s", "5m", "1.5h", "250ms", 7)] == [30, 300, 5400, 0.25, 7]
    with pytest.raises(ValueError, match=r"^interval 'soon' is not a duration; write it like"):
        parse_duration("soon")


def test_fixed_seconds_and_steps() -> None:
    clock = Clock()
    p = IntervalPolicy("30s", clock=clock)
    clock.t = 29.9
    assert not p.due()
    clock.t = 30
    assert p.due()
    p.mark()
    assert not p.due()
    s = IntervalPolicy(every_steps=100, clock=clock)
    assert not s.due(5) and not s.due(99) and s.due(100)  # multiples of 100 (issue 8, 1.9)
    s.force()
    s.mark(105)
    assert not s.due(106) and not s.due(199) and s.due(200)
    s.force()
    assert s.due(106)


def test_auto_uses_young_daly_and_retunes_when_the_cost_moves() -> None:
    clock = Clock()
    p = IntervalPolicy("auto", mtbf_s=3600, initial_s=10, smoothing=1.0, clock=clock)
    assert p.decision.every_s == 10 and p.decision.cost_s is None
    d = p.record(blocking_s=0.5, background_s=1.5)
    assert d is not None and d.mtbf_source == "configured"
    assert d.every_s == pytest.approx(math.sqrt(2 * 2.0 * 3600))
    assert "young/daly" in d.reason and d.as_event()["cost_s"] == 2.0
    assert p.record(blocking_s=0.5, background_s=1.6) is None  # +5%: no re-tune
    d2 = p.record(blocking_s=4, background_s=4)  # 4x the cost: re-tuned
    assert d2 is not None and d2.every_s == pytest.approx(math.sqrt(2 * 8.0 * 3600))
    clock.t += d2.every_s - 1  # type: ignore[operator]
    assert not p.due()
    clock.t += 1
    assert p.due()


def test_auto_observed_mtbf_and_clamping() -> None:
    p = IntervalPolicy("auto", clock=Clock(), smoothing=1.0, max_s=100)
    p.record(blocking_s=1, background_s=0)
    assert p.decision.mtbf_source == "default" and p.decision.every_s == 100
    d = p.observe_failures(uptime_s=800, failures=4)
    assert d is not None and d.mtbf_source == "observed" and d.mtbf_s == 200
    assert d.every_s == pytest.approx(20.0)


def ns(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(json=False, dry_run=False, grace=0.0, keep_every=None, **kw)


def test_cli_handlers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = LocalStorage(tmp_path)
    for i in range(1, 5):
        save(storage, f"run/c{i}", {"w": np.full(10, i, dtype=np.float32), "i": i},
             meta={"step": i})
    run = str(tmp_path / "run")
    assert cli.cmd_ckpt(ns(ckpt_cmd="ls", path=run)) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and out[0].startswith("run/c1  v2  step=1  ")
    assert cli.cmd_ckpt(ns(ckpt_cmd="inspect", path=f"{run}/c2")) == 0
    out = capsys.readouterr().out
    assert "run/c2  format v2" in out and "w: ndarray <f4 [10] 40 B" in out and "i: 2" in out
    assert cli.cmd_ckpt(ns(ckpt_cmd="verify", path=run)) == 0
    assert capsys.readouterr().out.count("ok   ") == 4
    storage.remove(next(iter(storage.walk("blobs"))).path)  # the blob of one checkpoint
    assert cli.cmd_ckpt(ns(ckpt_cmd="verify", path=run)) == 1
    assert "BAD  run/c" in capsys.readouterr().out
    assert cli.cmd_ckpt(ns(ckpt_cmd="prune", path=run, keep_last=2)) == 0
    out = capsys.readouterr().out
    assert "deleted run/c1" in out and "kept run/c4 (last)" in out


def test_cli_parser_builds() -> None:
    p = argparse.ArgumentParser()
    cli.add_parser(p.add_subparsers(dest="cmd"))
    a = p.parse_args(["ckpt", "prune", "/x", "--keep-last", "3", "--keep-every", "10"])
    assert (a.ckpt_cmd, a.keep_last, a.keep_every) == ("prune", 3, 10)


def test_manager_saves_prunes_and_restores(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, keep_last=2, every_steps=10) as mgr:
        assert mgr.restore_latest() is None
        for step in range(0, 50, 10):
            mgr.save(step, {"w": np.full(100, step), "step": step})
        mgr.wait()
        assert mgr.steps() == [30, 40]
    again = CheckpointManager(tmp_path, keep_last=2)
    got = again.restore_latest()
    assert got is not None and got[0] == 40 and got[1]["w"][0] == 40
    storage = again.storage
    newest = read_manifest(storage, "checkpoints/step-0000000040")
    storage.remove(next(iter(newest.files)))  # break the newest one
    with pytest.warns(RuntimeWarning, match=r"failed verification .*; using checkpoint "
                      r"checkpoints/step-0000000030 of step 30; the bad one was moved to quarantine/"):
        restored = again.restore_latest()
    assert restored is not None and restored[0] == 30
    assert again.steps() == [30]  # the bad one went to quarantine
    again.close()
