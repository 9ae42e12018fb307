"""Exactly once when an attempt is SIGKILLed at each phase of the sink commit protocol.

The in-process double (``fakectx.Crash``) unwinds with an exception, so
``finally`` blocks and context managers still run: cleanup that a real SIGKILL
skips. Here every attempt runs in a forked child that SIGKILLs itself at the
chosen phase, so only what it had made durable survives. The committed step
state lives in a file written the way the store commits (atomic replace after
fsync), fenced on the attempt's epoch like the store's commit.

After each kill, nothing may be published beyond what the last committed
checkpoint covers; after the run completes, every record is published once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakectx import write_jsonl
from sinkkit import SinkKit, records, transform

from segue.data import ExternalCallSink, JsonlSource, Sink, run_map
from segue.errors import FencedError
from segue.run.context import Park

N = 300
# Phases of one commit cycle, in order: write -> stage -> checkpoint commit -> publish,
# and of the next attempt's recovery (sink.open rolls the committed parts forward).
CYCLE = ["write", "staged", "commit-before", "commit-after", "published"]
RECOVERY = ["recover", "recover-mid"]
MID_PUBLISH = {"jsonl", "parquet", "external"}  # SQL sinks publish in one transaction
KINDS = ["jsonl", "parquet", "sqlite", "sqlite-upsert", "external"]
EXIT_DONE, EXIT_PARKED, EXIT_ERROR = 0, 3, 1


def nth(phase: str, i: int) -> int:
    """Which hit of ``phase`` to kill at: recovery happens once per attempt."""
    return 1 if phase.startswith("recover") else 2 + i % 2


def phases(kind: str) -> list[str]:
    """The kill points of ``kind``, in an order where each one can be reached: a kill
    while recovering follows a kill that left committed parts to roll forward."""
    mid = ["publish-mid"] if kind in MID_PUBLISH else []
    rec = RECOVERY[::-1] if kind in ("jsonl", "parquet") else RECOVERY[:1]
    return CYCLE[:4] + rec + mid + CYCLE[4:]


class KillPlan:
    """In the child: SIGKILL this process on the ``nth`` hit of ``phase``."""

    def __init__(self, root: Path, phase: str | None, nth: int) -> None:
        self.root, self.phase, self.nth = root, phase, nth
        self.hits: Counter[str] = Counter()
        self.inside: str | None = None  # "publish" | "open" while the sink runs them

    def hit(self, phase: str) -> None:
        self.hits[phase] += 1
        if phase == self.phase and self.hits[phase] == self.nth:
            # Durable note of where it died, so the parent can tell the kill landed here.
            fd = os.open(self.root / "died-at", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.write(fd, phase.encode())
            os.fsync(fd)
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)


class KillSink(Sink):
    """Delegates to a real sink, with kill points between the protocol's phases."""

    def __init__(self, inner: Sink, plan: KillPlan) -> None:
        self.inner, self.plan = inner, plan
        self.needs_keys = inner.needs_keys
        self.supports_workers = inner.supports_workers

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def open(self, scope: Any, state: Any) -> None:
        self.plan.inside = "open"
        self.inner.open(scope, state)
        self.plan.inside = None
        if state is not None:
            self.plan.hit("recover")

    def write(self, recs: Any, shard: str, keys: Any = None) -> None:
        self.inner.write(recs, shard, keys)
        self.plan.hit("write")

    def stage(self) -> None:
        self.inner.stage()
        self.plan.hit("staged")

    def state(self) -> dict[str, Any]:
        return self.inner.state()

    def publish(self) -> None:
        self.plan.inside = "publish"
        self.inner.publish()
        self.plan.inside = None
        self.plan.hit("published")

    def finish(self) -> None:
        self.inner.finish()

    def close(self) -> None:
        self.inner.close()


class DurableRun:
    """Plays the store across processes: the current epoch and the committed state, in files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.epoch = 0

    @property
    def state_path(self) -> Path:
        return self.root / "committed.json"

    def committed(self) -> Any:
        return json.loads(self.state_path.read_text()) if self.state_path.exists() else None

    def begin(self) -> int:
        self.epoch += 1
        _write_durable(self.root / "epoch", str(self.epoch).encode())
        return self.epoch


class DurableCtx:
    """A StepContext stand-in whose checkpoint is a durable, fenced commit."""

    def __init__(self, run: DurableRun, epoch: int, plan: KillPlan) -> None:
        self.run, self.epoch, self.plan = run, epoch, plan
        self.run_id, self.step, self.attempt = "run1", "step1", epoch
        self.params: dict[str, Any] = {}
        self.home = str(run.root.parent / "home")  # dead letters: one home per scenario
        self.due = 0

    def restore(self) -> Any:
        return self.run.committed()

    def checkpoint_due(self, steps: int | None = None) -> bool:
        self.due += 1
        return self.due % 2 == 0

    def progress(self, done: float, total: float | None = None) -> None:
        pass

    def checkpoint(self, state: Any, *, position: Any = None, durable: bool = False) -> None:
        assert durable, "the data driver must checkpoint with durable=True before publishing"
        self.plan.hit("commit-before")
        if int((self.run.root / "epoch").read_text()) != self.epoch:
            raise FencedError(f"epoch {self.epoch} superseded")
        _write_durable(self.run.state_path, json.dumps(state).encode())
        self.plan.hit("commit-after")


def _write_durable(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


class Receiver:
    """A remote API in a file: deduplicates on the idempotency key, counts deliveries."""

    def __init__(self, path: Path, plan: KillPlan | None = None) -> None:
        self.path, self.plan = path, plan
        self.conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")  # survives a process kill, and is fast
        self.conn.execute("CREATE TABLE IF NOT EXISTS got (key TEXT PRIMARY KEY, body TEXT, n INTEGER)")

    def __call__(self, record: Any, key: str) -> None:
        self.conn.execute("INSERT INTO got VALUES (?, ?, 1) ON CONFLICT (key) DO UPDATE SET n = n + 1",
                          (key, json.dumps(record, sort_keys=True)))
        if self.plan is not None and self.plan.inside == "publish":
            self.plan.hit("publish-mid")

    def read(self) -> list[dict[str, Any]]:
        return [json.loads(b) for (b,) in self.conn.execute("SELECT body FROM got")]


class Scenario:
    def __init__(self, tmp_path: Path, kind: str, n: int = N) -> None:
        if kind == "parquet":
            pytest.importorskip("pyarrow", reason="pyarrow is not installed; pip install pyarrow")
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.tmp, self.kind, self.n = tmp_path, kind, n
        self.kit = SinkKit(kind, tmp_path)
        self.run = DurableRun(tmp_path / "run")
        recs = records(n)
        for f in range(3):
            write_jsonl(tmp_path / f"in-{f}.jsonl", recs[f::3])

    def make_sink(self, plan: KillPlan) -> Sink:
        if self.kind == "external":
            return ExternalCallSink(Receiver(self.tmp / "receiver.db", plan), str(self.tmp / "ledger.db"))
        return self.kit.make()

    def published(self) -> list[dict[str, Any]]:
        if self.kind == "external":
            if not (self.tmp / "receiver.db").exists():
                return []
            return Receiver(self.tmp / "receiver.db").read()
        return self.kit.read()

    def attempt(self, phase: str | None = None, nth: int = 1) -> str:
        """One attempt in a forked child; returns how it ended: done | parked | killed at PHASE."""
        epoch = self.run.begin()
        died = self.run.root / "died-at"
        died.unlink(missing_ok=True)
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = EXIT_ERROR
            try:
                plan = KillPlan(self.run.root, phase, nth)
                if phase in ("publish-mid", "recover-mid") and self.kind != "external":
                    _kill_between_renames(plan)
                ctx = DurableCtx(self.run, epoch, plan)
                src = JsonlSource(str(self.tmp / "in-*.jsonl"), shard_bytes=700)
                run_map(ctx, src, transform, KillSink(self.make_sink(plan), plan))
                code = EXIT_DONE
            except Park:
                code = EXIT_PARKED
            except BaseException:
                (self.run.root / "error.txt").write_text(traceback.format_exc())
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            assert os.WTERMSIG(status) == signal.SIGKILL
            return f"killed at {died.read_text()}"
        code = os.WEXITSTATUS(status)
        err = self.run.root / "error.txt"
        assert code != EXIT_ERROR, err.read_text() if err.exists() else "no error report"
        return {EXIT_DONE: "done", EXIT_PARKED: "parked"}[code]

    def check_nothing_beyond_commit(self) -> None:
        """After a kill: published records are distinct and covered by the committed state."""
        got = self.published()
        keys = Counter(r["k"] for r in got)
        assert all(c == 1 for c in keys.values()), "a record was published twice"
        committed = self.run.committed()
        covered = 0 if committed is None else committed["stats"]["records_out"]
        assert len(got) <= covered, f"{len(got)} published but only {covered} committed"

    def check_exactly_once(self) -> None:
        got = self.published()
        counts = Counter(r["k"] for r in got)
        assert sorted(counts) == list(range(self.n)) and set(counts.values()) == {1}
        assert sorted(got, key=lambda r: r["k"]) == [transform(r) for r in records(self.n)]


def _kill_between_renames(plan: KillPlan) -> None:
    """In the child only: a kill point after each rename a file sink makes while it publishes
    (or rolls forward in open), so the kill lands with some parts published and others not."""
    real = os.replace

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        real(src, dst, **kw)
        if plan.inside == "publish":
            plan.hit("publish-mid")
        elif plan.inside == "open":
            plan.hit("recover-mid")

    os.replace = replace  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGUE_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_at_each_phase_then_exactly_once(tmp_path: Path, kind: str) -> None:
    """Per phase: a fresh run whose attempt is SIGKILLed there, then recovered to completion."""
    for phase in phases(kind):
        sc = Scenario(tmp_path / phase, kind)
        if phase.startswith("recover"):
            # Leave committed-but-unpublished parts behind, then die while recovering them.
            assert sc.attempt("commit-after", 2) == "killed at commit-after"
            sc.check_nothing_beyond_commit()
        # Not the first hit: at least one whole commit cycle is behind the kill.
        assert sc.attempt(phase, nth(phase, 0)) == f"killed at {phase}", phase
        sc.check_nothing_beyond_commit()
        assert sc.attempt() == "done", phase
        sc.check_exactly_once()


@pytest.mark.parametrize("kind", KINDS)
def test_many_sigkills_in_one_run_exactly_once(tmp_path: Path, kind: str) -> None:
    """One run through a seeded series of kills at every phase, checked after each kill."""
    sc = Scenario(tmp_path, kind, n=2000)  # long enough that every planned kill lands first
    landed: Counter[str] = Counter()
    for i, phase in enumerate(phases(kind) * 2):
        ended = sc.attempt(phase, nth(phase, i))
        assert ended == f"killed at {phase}", (phase, ended)
        landed[phase] += 1
        sc.check_nothing_beyond_commit()
    assert sc.attempt() == "done"
    sc.check_exactly_once()
    # Each phase was hit by a real SIGKILL at least once before the run could finish.
    assert landed == Counter({p: 2 for p in phases(kind)}), landed
