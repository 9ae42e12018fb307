"""A generate step SIGKILLed mid-generation: every completion once, token-identical to a clean run.

Each attempt runs the real map step (``MapStep.run`` -> ``run_map`` -> the model session ->
TransformersGenerateHandler) in a forked child that SIGKILLs itself on observed progress:
the Nth checkpoint commit of a given kind, never a timer. The committed state lives in a
file written the way the store commits (fsync, atomic replace), fenced on the epoch, and
every commit is also appended to a durable log, from which the test reads what each
attempt resumed: a request cut mid-generation must go on from its checkpointed tokens
(its next checkpoint holds them plus one chunk), never restart.
"""

from __future__ import annotations

import json
import os
import signal
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from genkit import build_model, prompts

pytest.importorskip("torch", reason="torch is not installed; `pip install segue[hf]`")
pytest.importorskip("transformers", reason="transformers is not installed; `pip install segue[hf]`")

from segue._park import Park  # noqa: E402
from segue.data import JsonlSink, JsonlSource  # noqa: E402
from segue.data.mapstep import MapStep  # noqa: E402
from segue.errors import FencedError  # noqa: E402

N, BATCH, NEW, CHUNK = 10, 4, 32, 8
BUDGET = 110  # tokens: two requests of these prompts (up to ~20 tokens) + NEW fit, three do not
SAMPLED = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "seed": 11}


def _durable(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


def _append(path: Path, doc: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, (json.dumps(doc) + "\n").encode())
    os.fsync(fd)
    os.close(fd)


class Ctx:
    """A StepContext stand-in: a checkpoint is due at every offer; a commit is durable and
    fenced; ``kill=(kind, n)`` SIGKILLs the process after its n-th commit of that kind
    (``mid``: inside a batch, with tokens in flight; ``batch``: at a batch's end)."""

    def __init__(self, root: Path, epoch: int, kill: tuple[str, int] | None) -> None:
        self.root, self.epoch, self.kill = root, epoch, kill
        self.run_id, self.step, self.attempt, self.params = "run1", "gen", epoch, {}
        self.home = str(root / "home")
        self.commits: Counter[str] = Counter()

    def restore(self) -> Any:
        p = self.root / "committed.json"
        return json.loads(p.read_text()) if p.exists() else None

    def checkpoint_due(self, steps: int | None = None) -> bool:
        return True

    def progress(self, done: float, total: float | None = None) -> None:
        pass

    def checkpoint(self, state: Any, *, position: Any = None, durable: bool = False) -> None:
        assert durable
        if int((self.root / "epoch").read_text()) != self.epoch:
            raise FencedError(f"epoch {self.epoch} superseded")
        _durable(self.root / "committed.json", json.dumps(state).encode())
        kind = "mid" if state.get("unit") else "batch"
        unit = {rid: len(v["tokens"]) for rid, v in (state.get("unit") or {}).items() if v["finish"] is None}
        _append(self.root / "commits.jsonl", {"epoch": self.epoch, "kind": kind, "unit": unit,
                                              "records_out": state["stats"]["records_out"]})
        self.commits[kind] += 1
        if self.kill is not None and self.kill == (kind, self.commits[kind]):
            os.kill(os.getpid(), signal.SIGKILL)


def generate(batch: Any, model: Any) -> Any:
    return model(batch)


class Scenario:
    def __init__(self, root: Path, model: Path, sampling: dict[str, Any]) -> None:
        self.root, self.model, self.sampling = root, model, sampling  # the handler's keywords
        root.mkdir(parents=True)
        with open(root / "prompts.jsonl", "w") as f:
            for p in prompts(N):
                f.write(json.dumps(p) + "\n")
        self.epoch = 0

    def attempt(self, kill: tuple[str, int] | None = None) -> str:
        from segue.inference.handlers import TransformersGenerateHandler

        self.epoch += 1
        _durable(self.root / "epoch", str(self.epoch).encode())
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                import torch

                torch.set_num_threads(1)
                handler = TransformersGenerateHandler(self.model, max_new_tokens=NEW, checkpoint_tokens=CHUNK,
                                                      batch_size=BATCH, device="cpu", **self.sampling)
                step = MapStep(fn=generate, source=JsonlSource(str(self.root / "prompts.jsonl")),
                               sink=JsonlSink(str(self.root / "out")), model=handler)
                step.run(Ctx(self.root, self.epoch, kill))
                code = 0
            except Park:
                code = 3
            except BaseException:
                (self.root / "error.txt").write_text(traceback.format_exc())
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            assert os.WTERMSIG(status) == signal.SIGKILL
            return "killed"
        err = self.root / "error.txt"
        assert os.WEXITSTATUS(status) == 0, err.read_text() if err.exists() else status
        return "done"

    def published(self) -> list[dict[str, Any]]:
        out = self.root / "out"
        return [json.loads(line) for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]

    def commits(self) -> list[dict[str, Any]]:
        p = self.root / "commits.jsonl"
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []

    def check_nothing_beyond_commit(self) -> None:
        got = self.published()
        ids = Counter(r["id"] for r in got)
        assert all(c == 1 for c in ids.values()), f"published twice: {[k for k, c in ids.items() if c > 1]}"
        committed = json.loads((self.root / "committed.json").read_text())
        assert len(got) <= committed["stats"]["records_out"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny-lm") / "m")


@pytest.mark.parametrize("mode", ["greedy", "sampled", "bucketed"])
def test_sigkills_mid_generation_resume_from_tokens_exactly_once(tmp_path: Path, lm: Path, mode: str) -> None:
    """``bucketed``: the faulty run decodes each window of 4 in sub-batches of at most
    BUDGET tokens (bucketed by prompt length) and still ends token-identical to the clean
    run, which decodes each window whole."""
    sampling = SAMPLED if mode != "greedy" else {}
    clean = Scenario(tmp_path / "clean", lm, sampling)
    assert clean.attempt() == "done"
    want = {r["id"]: r for r in clean.published()}
    assert sorted(want) == [f"p{k:02d}" for k in range(N)]
    assert any(r["completion_tokens"] > 2 * CHUNK for r in want.values())  # long enough to be cut

    if mode == "bucketed":  # the budget does cut every full window (2 sub-batches of 2)
        from tokenizers import Tokenizer

        from segue.inference.kvbatch import KVBudget, bucket

        tok = Tokenizer.from_file(str(lm / "tokenizer.json"))
        widths = [len(tok.encode(p["prompt"]).ids) for p in prompts(N)]
        cuts = [bucket(widths[k:k + BATCH], NEW, KVBudget(BUDGET)) for k in range(0, N, BATCH)]
        assert [len(c.groups) for c in cuts] == [2, 2, 1] and not any(c.too_long for c in cuts)
    sc = Scenario(tmp_path / "faulty", lm, {**sampling, "token_budget": BUDGET} if mode == "bucketed" else sampling)
    # Kills on observed progress: after the 2nd mid-batch commit (16 tokens in flight),
    # after a batch's commit, after the 1st mid commit of the next attempt, and once
    # more mid-batch; each attempt resumes the one before.
    plan = [("mid", 2), ("batch", 1), ("mid", 1), ("mid", 3)]
    landed = 0
    for kill in plan:
        before = len(sc.commits())
        assert sc.attempt(kill) == "killed", kill
        landed += 1
        sc.check_nothing_beyond_commit()
        assert len(sc.commits()) > before  # the attempt made progress before it died
    assert sc.attempt() == "done"
    assert landed == len(plan)

    got = sc.published()
    ids = Counter(r["id"] for r in got)
    assert sorted(ids) == sorted(want) and set(ids.values()) == {1}, ids
    changed = [r["id"] for r in got if r["token_ids"] != want[r["id"]]["token_ids"]]
    assert not changed, f"{len(changed)} of {N} completions differ from the uninterrupted run: {changed}"
    assert [r for r in sorted(got, key=lambda r: r["id"])] == [want[k] for k in sorted(want)]

    # From the commit log: each attempt that started from a mid-batch cut went on from the
    # checkpointed tokens (its first commit holds them plus one chunk, not one chunk).
    log = sc.commits()
    resumed = 0
    for epoch in range(2, sc.epoch + 1):
        prev = [c for c in log if c["epoch"] < epoch]
        first = next((c for c in log if c["epoch"] == epoch), None)
        if not prev or prev[-1]["kind"] != "mid" or first is None or first["kind"] != "mid":
            continue
        for rid, n in prev[-1]["unit"].items():
            if rid in first["unit"]:
                assert first["unit"][rid] == n + CHUNK, (epoch, rid, n, first["unit"][rid])
                resumed += 1
    assert resumed >= 4, log
