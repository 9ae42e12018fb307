"""`segue ckpt ... RUN`: the checkpoint commands applied to a run of this home,
and `segue ckpt now RUN`, which asks the run's workers to checkpoint at once."""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import CheckpointCorruptError, UnknownRunError, UsageError
from ..home import Home
from . import ckpt


def add_parser(sub: Any) -> None:
    p = ckpt.add_parser(sub)
    # `ckpt` already has its sub-parsers; add `now` beside them.
    inner = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    now = inner.add_parser("now", help="ask every running task of RUN to checkpoint at its next pause point")
    now.add_argument("run")


def _run_dirs(home: Home, run_id: str) -> list[str] | None:
    """The checkpoint directories of a run's steps, or None if ``run_id`` is no run here."""
    if not home.exists() or os.path.exists(run_id) or "://" in run_id:
        return None
    try:
        store = home.open_store()
        run = store.get_run(run_id)
        tasks = store.get_tasks(run_id)
    except UnknownRunError:
        return None
    url = str(run.options.get("checkpoints") or "")
    if "://" in url and not url.startswith("file://"):
        # Object storage has no directories to test: the store says which steps have some.
        return [f"{url.rstrip('/')}/runs/{run_id}/{t.step}/ckpt" for t in tasks
                if store.list_checkpoints(run_id, t.step)]
    base = Path(url.removeprefix("file://")) if url else home.data_dir
    dirs = [base / "runs" / run_id / t.step / "ckpt" for t in tasks]
    return [str(d) for d in dirs if d.is_dir() and any(d.iterdir())]


def cmd_ckpt(a: argparse.Namespace, client: Any) -> int:
    home: Home = client.home
    if a.ckpt_cmd == "now":
        return _now(a.run, client)
    dirs = _run_dirs(home, a.path)
    if dirs is None:
        return ckpt.cmd_ckpt(a)
    if a.ckpt_cmd == "prune":
        raise UsageError("a run's checkpoints are pruned by its steps' keep_checkpoints; "
                         "pass a directory to prune by hand")
    if a.ckpt_cmd == "verify":
        return _verify_run(home, a.path)
    if not dirs:
        print(f"segue: run {a.path!r} has no checkpoint", file=sys.stderr)
        return 1
    code = 0
    for d in dirs:
        sub = copy.copy(a)
        sub.path = d
        code = max(code, ckpt.cmd_ckpt(sub))
    return code


def _verify_run(home: Home, run_id: str) -> int:
    """Verify every checkpoint the store says is committed, the ones a restore would use.

    The store, not the directory listing, is the truth here: a committed checkpoint
    whose manifest is gone has no directory entry to list, yet a restore would try
    it (and fall back past it), so it is reported as BAD.
    """
    from ..checkpoint.io import list_dir_checkpoints, verify

    store = home.open_store()
    storage = home.run_storage(store.get_run(run_id))
    checked = bad = 0
    for t in store.get_tasks(run_id):
        committed = store.list_checkpoints(run_id, t.step)  # newest first
        for rec in reversed(committed):
            checked += 1
            try:
                verify(storage, rec.path)
                print(f"ok   {rec.path}")
            except CheckpointCorruptError as e:
                bad += 1
                print(f"BAD  {rec.path}: {e.detail} (checkpoint {rec.seq} of step {t.step!r}, "
                      "committed in the store)")
        known = {c.path for c in committed}
        for path in list_dir_checkpoints(storage, f"runs/{run_id}/{t.step}/ckpt"):
            if path not in known:  # a save killed between its manifest and its commit
                print(f"skip {path}: not committed in the store; a restore never uses it")
    if not checked:
        print(f"segue: run {run_id!r} has no committed checkpoint", file=sys.stderr)
        return 1
    return 1 if bad else 0


def _now(run_id: str, client: Any) -> int:
    asked = client.checkpoint_now(run_id)
    print(f"asked {', '.join(asked)} to checkpoint now")
    return 0
