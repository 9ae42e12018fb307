"""In-process doubles for data-step tests: a StepContext stand-in with crash injection.

``FakeRun`` plays the store (committed state, current epoch); each
``FakeCtx`` is one attempt. A ``Crash`` can be armed before or after the
commit, and ``pause`` makes checkpoint raise Park after committing, as the
real StepContext does.

A ``Crash`` is an exception: it unwinds through ``finally`` blocks and context
managers, running cleanup that a real SIGKILL skips. It exercises the
driver's logic quickly; the proof that output is exactly once under real
kills at every phase of the sink commit protocol is
``test_exactly_once_sigkill.py`` (forked attempts that SIGKILL themselves).
"""

from __future__ import annotations

import json
import random
from typing import Any

from segue.errors import FencedError
from segue.run.context import Park


class Crash(BaseException):
    """A simulated SIGKILL."""


class FakeRun:
    def __init__(self, run_id: str = "run1", step: str = "step1") -> None:
        self.run_id, self.step = run_id, step
        self.epoch = 0
        self.state: Any = None
        self.commits = 0
        self.positions: list[Any] = []

    def attempt(self, **kw: Any) -> FakeCtx:
        self.epoch += 1
        return FakeCtx(self, self.epoch, **kw)


class FakeCtx:
    def __init__(self, run: FakeRun, epoch: int, *, every: int = 1, crash: str | None = None,
                 crash_after: int = 0, pause_after: int | None = None, rng: random.Random | None = None,
                 params: dict[str, Any] | None = None) -> None:
        self.run, self.epoch = run, epoch
        self.run_id, self.step, self.attempt = run.run_id, run.step, epoch
        self.params = params or {}
        self.every, self.crash, self.crash_after, self.pause_after = every, crash, crash_after, pause_after
        self.rng = rng
        self.calls = 0
        self.done: tuple[float, float | None] | None = None

    def restore(self) -> Any:
        return None if self.run.state is None else json.loads(json.dumps(self.run.state))

    def checkpoint_due(self, steps: int | None = None) -> bool:
        if self.rng is not None:
            return self.rng.random() < 1 / self.every
        return True

    def progress(self, done: float, total: float | None = None) -> None:
        self.done = (done, total)

    def checkpoint(self, state: Any, *, position: Any = None, durable: bool = False) -> None:
        # The real context saves in the background unless asked to wait; a sink
        # publishes right after this call, so the driver must ask.
        assert durable, "the data driver must checkpoint with durable=True before publishing"
        self.calls += 1
        if self.crash == "before" and self.calls > self.crash_after:
            raise Crash()
        if self.epoch != self.run.epoch:
            raise FencedError(f"epoch {self.epoch} superseded by {self.run.epoch}")
        self.run.state = json.loads(json.dumps(state))  # the state must be plain JSON
        self.run.commits += 1
        self.run.positions.append(position)
        if self.crash == "after" and self.calls > self.crash_after:
            raise Crash()
        if self.pause_after is not None and self.calls > self.pause_after:
            raise Park()


def write_jsonl(path: Any, records: list[Any]) -> None:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def read_jsonl_dir(directory: Any, pattern: str = "part-*.jsonl") -> list[Any]:
    from pathlib import Path

    out: list[Any] = []
    for p in sorted(Path(directory).glob(pattern)):
        out.extend(json.loads(line) for line in p.read_text().splitlines() if line)
    return out
