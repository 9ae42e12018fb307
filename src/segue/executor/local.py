"""Run each attempt as a local child process (``python -m segue._worker_main``).

The controller's options record for the worker (``Launch.options``) is written as
one JSON line on the child's stdin (``--options-stdin``); the child's environment is
the controller's plus what other tools read (``CUDA_VISIBLE_DEVICES``), nothing segue
sets for itself.

A data step with a fixed number of sub-workers has them warmed: the worker starts
them first thing, before it reads the store (``--warm N``, segue.executor.local_warm).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from .base import Executor, Launch, WorkerHandle, warm_members


class ProcessHandle(WorkerHandle):
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass


class LocalProcessExecutor(Executor):
    def launch(self, spec: Launch) -> ProcessHandle:
        env = dict(os.environ)
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [
            sys.executable, "-m", "segue._worker_main",
            "--home", str(spec.home), "--run", spec.run_id, "--step", spec.step,
            "--epoch", str(spec.epoch), "--parent-pid", str(os.getpid()), "--options-stdin",
        ]
        warm = warm_members(spec)
        if warm:  # started by the worker first thing (executor.local_warm)
            cmd += ["--warm", str(warm)]
        with open(spec.log_path, "ab") as log:
            # A new session: the terminal's Ctrl-C reaches the controller only,
            # which decides between a graceful pause and an immediate stop.
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                env=env, start_new_session=True,
            )
        write_options(proc, spec.options)
        return ProcessHandle(proc)


def write_options(proc: subprocess.Popen[bytes], options: dict[str, object]) -> None:
    """Hand a started segue process (a worker, a detached controller) its options record:
    one JSON line on its stdin, then EOF. A small record fits the pipe's buffer whether
    or not the process reads yet; one that already died leaves a broken pipe, and its
    exit code says why."""
    if proc.stdin is None:  # not started with stdin=PIPE: nothing to hand
        return
    try:
        with proc.stdin:
            proc.stdin.write(json.dumps(options).encode() + b"\n")
    except BrokenPipeError:
        pass
