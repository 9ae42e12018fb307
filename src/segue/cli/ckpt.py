"""`segue ckpt ls|inspect|verify|prune PATH`: a thin shell over segue.checkpoint.catalog.

PATH is a local directory or an fsspec URL: a checkpoint, or a directory of them.
This module only parses and prints. Wire it with ``ckpt.add_parser(sub)`` and
``COMMANDS["ckpt"] = ckpt.cmd_ckpt``. PATH may also be the directory given to
``CheckpointManager`` (its checkpoints are under ``checkpoints/``), or where runs
keep theirs (HOME/data, a ``--checkpoints`` URL: each ``runs/RUN/STEP/ckpt`` in turn).

Exit codes, as for every segue command: 0 ok; 1 a checkpoint failed verification,
or PATH holds no checkpoint (a line on stderr says so: a check that found nothing
to check did not pass); 2 bad usage, such as a local PATH that does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the checkpoint engine (NumPy) is imported by the commands, not by `segue --help`
    from ..checkpoint.storage import CheckpointStorage
from ..errors import UsageError

# Where runs keep checkpoints is documented once: docs/ARCHITECTURE.md.
PATH_HELP = ("a checkpoint, a directory of them, the directory given to CheckpointManager, a run "
             "id, or where runs keep their checkpoints: HOME/data, or the run's --checkpoints URL "
             "(see \"Where a run's checkpoints live\" in docs/ARCHITECTURE.md)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "ckpt", help="list, inspect, verify and prune checkpoints in a directory or URL"
    )
    sub = p.add_subparsers(dest="ckpt_cmd", required=True)
    ls = sub.add_parser("ls", help="list the checkpoints under PATH")
    ls.add_argument("path", help=PATH_HELP)
    ls.add_argument("--json", action="store_true", help="as one JSON array")
    ins = sub.add_parser("inspect", help="tree, dtypes and sizes of a checkpoint (or the newest)")
    ins.add_argument("path", help=PATH_HELP)
    ins.add_argument("--json", action="store_true")
    ver = sub.add_parser("verify", help="check every hash of a checkpoint, or of all under PATH")
    ver.add_argument("path", help=PATH_HELP)
    pr = sub.add_parser("prune", help="delete checkpoints the retention policy does not keep")
    pr.add_argument("path", help="a directory of checkpoints, or the directory given to CheckpointManager")
    pr.add_argument("--keep-last", type=int, required=True, metavar="N")
    pr.add_argument("--keep-every", type=int, default=None, metavar="K")
    pr.add_argument("--dry-run", action="store_true")
    pr.add_argument("--grace", type=float, default=600.0, metavar="S",
                    help="keep unreferenced blobs younger than this (default 600 s)")
    return p


def _locate(path: str) -> tuple[CheckpointStorage, str, bool]:
    from ..checkpoint import catalog

    if "://" not in path and not os.path.exists(path):
        raise UsageError(f"{path}: no such file or directory; pass a checkpoint, a directory "
                         "of checkpoints, or the directory given to CheckpointManager")
    if "://" not in path and not os.path.isdir(path):
        raise UsageError(f"{path} is a file; pass the checkpoint directory that holds it")
    return catalog.locate(path)


def _nothing_found(path: str) -> int:
    from ..checkpoint import catalog

    print(f"segue: no checkpoint under {path} (nor under {path.rstrip('/')}/"
          f"{catalog.MANAGER_PREFIX}); pass a checkpoint or a directory of them",
          file=sys.stderr)
    return 1


def cmd_ls(a: argparse.Namespace, paths: list[str] | None = None) -> int:
    """``paths``: list these directories instead of PATH, as one listing."""
    from ..checkpoint import catalog

    rows: list[Any] = []
    for path in paths if paths is not None else [a.path]:
        storage, rel, is_ckpt = _locate(path)
        rows += [catalog.summarize(storage, rel)] if is_ckpt else catalog.list_checkpoints(storage, rel)
    if a.json:
        print(json.dumps([r if isinstance(r, str) else r.__dict__ for r in rows], default=list))
    if not rows:
        return _nothing_found(a.path)
    if a.json:
        return 0
    for r in rows:
        if isinstance(r, str):
            print(f"BAD  {r}")
        else:
            tags = f"  tags={','.join(r.tags)}" if r.tags else ""
            print(f"{r.path}  v{r.version}  step={r.step}  {r.nbytes} B  {r.nfiles} files  "
                  f"{r.narrays} arrays  {r.created_at}{tags}")
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    from ..checkpoint import catalog
    from ..checkpoint.io import list_dir_checkpoints, read_manifest

    storage, rel, is_ckpt = _locate(a.path)
    if not is_ckpt:
        paths = list_dir_checkpoints(storage, rel)
        if not paths:
            return _nothing_found(a.path)
        rel = paths[-1]
    m = read_manifest(storage, rel)
    rows = catalog.describe_tree(m)
    if a.json:
        print(json.dumps({"path": rel, "version": m.version, "meta": m.meta,
                          "files": {k: v.__dict__ for k, v in m.files.items()},
                          "tree": dict(rows)}))
        return 0
    print(f"{rel}  format v{m.version}  created {m.created_at}  meta {json.dumps(m.meta)}")
    for key, desc in rows:
        print(f"  {key or '(root)'}: {desc}")
    print(f"  files: {len(m.files)}, {sum(f.size for f in m.files.values())} B")
    return 0


def cmd_verify(a: argparse.Namespace) -> int:
    from ..checkpoint import catalog
    from ..checkpoint.io import list_dir_checkpoints

    storage, rel, is_ckpt = _locate(a.path)
    paths = [rel] if is_ckpt else list_dir_checkpoints(storage, rel)
    if not paths:
        return _nothing_found(a.path)
    bad = 0
    for path, detail in catalog.verify_many(storage, paths):
        print(f"ok   {path}" if detail is None else f"BAD  {path}: {detail}")
        bad += detail is not None
    return 1 if bad else 0


def cmd_prune(a: argparse.Namespace) -> int:
    from ..checkpoint.retention import RetentionPolicy, prune

    storage, rel, is_ckpt = _locate(a.path)
    if is_ckpt:
        raise UsageError(f"{a.path} is one checkpoint; prune takes the directory that holds them")
    try:
        policy = RetentionPolicy(keep_last=a.keep_last, keep_every=a.keep_every)
    except ValueError as e:
        raise UsageError(str(e)) from None
    report = prune(storage, rel, policy, grace_s=a.grace, dry_run=a.dry_run)
    verb = "would delete" if a.dry_run else "deleted"
    for path in report.plan.delete:
        print(f"{verb} {path}")
    for path in report.plan.keep:
        print(f"kept {path} ({report.plan.reasons[path]})")
    if report.gc is not None:
        print(f"blobs: {verb} {len(report.gc.deleted)} ({report.gc.freed_bytes} B), "
              f"kept {report.gc.kept_live} live, {report.gc.kept_pending} pending, "
              f"{report.gc.kept_recent} recent")
    return 0


HANDLERS = {"ls": cmd_ls, "inspect": cmd_inspect, "verify": cmd_verify, "prune": cmd_prune}


def run_storage_dirs(path: str) -> list[str] | None:
    """The step checkpoint directories (``runs/RUN/STEP/ckpt``) under a runs' storage
    directory (HOME/data, a ``--checkpoints`` location), its ``runs/`` or one run's
    directory; None when PATH is none of those, or holds checkpoints of its own."""
    from ..checkpoint import catalog
    from ..checkpoint.io import list_dir_checkpoints

    if "://" not in path and not os.path.isdir(path):
        return None  # _locate says what is wrong with it
    text = (path if "://" in path else os.path.abspath(path)).rstrip("/") or "/"
    storage = catalog.open_storage(text)
    if storage.exists(catalog.MANIFEST_NAME) or any(
            list_dir_checkpoints(storage, p) for p in ("", catalog.MANAGER_PREFIX)):
        return None
    parts = text.split("/")
    if "runs" in storage.listdir(""):
        runs = [f"runs/{r}" for r in storage.listdir("runs")]
    elif parts[-1] == "runs":
        runs = storage.listdir("")
    elif len(parts) > 1 and parts[-2] == "runs":
        runs = [""]
    else:
        return None
    steps = [f"{r}/{s}/ckpt".lstrip("/") for r in runs for s in storage.listdir(r)]
    return [f"{text}/{d}" for d in steps if list_dir_checkpoints(storage, d)]


def cmd_ckpt(a: argparse.Namespace, home: object = None) -> int:
    """Dispatch ``segue ckpt <sub>``; ``home`` is unused (paths are explicit). PATH may be
    where runs keep their checkpoints (HOME/data): each step's directory in turn."""
    dirs = run_storage_dirs(a.path)
    if dirs is None:
        return HANDLERS[a.ckpt_cmd](a)
    if a.ckpt_cmd == "prune":
        raise UsageError(f"{a.path} holds runs' checkpoints, pruned by their steps' keep_checkpoints; "
                         "pass one step's directory (runs/RUN/STEP/ckpt) to prune by hand")
    if not dirs:
        return _nothing_found(a.path)
    if a.ckpt_cmd == "ls":  # one listing (one JSON array with --json)
        return cmd_ls(a, dirs)
    code = 0
    for d in dirs:
        code = max(code, HANDLERS[a.ckpt_cmd](argparse.Namespace(**{**vars(a), "path": d})))
    return code
