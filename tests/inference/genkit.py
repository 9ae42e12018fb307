"""Shared by the generate tests: the tiny model built in a child process, and prompts.

The model is built in a forked child so the pytest process never runs torch
itself before the SIGKILL tests fork their attempts (a process that forks
after using an OpenMP thread pool can hang in the child).
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any


def in_child(fn: Any, *args: Any) -> None:
    """Run ``fn(*args)`` in a forked child with one torch thread; raise if it failed."""
    err = Path(f"/tmp/segue-genkit-{os.getpid()}-{id(fn)}.err")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            torch.set_num_threads(1)
            fn(*args)
            code = 0
        except BaseException:
            err.write_text(traceback.format_exc())
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        msg = err.read_text() if err.exists() else f"child ended with status {status}"
        err.unlink(missing_ok=True)
        raise AssertionError(msg)


def build_model(path: Path, **shape: Any) -> Path:
    from segue.inference.testing import tiny_causal_lm

    if not (path / "config.json").exists():
        in_child(lambda: tiny_causal_lm(path, **shape))
    return path


def prompts(n: int) -> list[dict[str, Any]]:
    """Prompts of different lengths (so left padding matters), each with an id."""
    words = "the model reads a prompt and writes tokens one at a time".split()
    return [{"id": f"p{k:02d}", "prompt": f"request {k}: " + " ".join(words[: 1 + (k * 5) % len(words)])}
            for k in range(n)]
