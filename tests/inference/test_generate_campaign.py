"""A generate step under a kill campaign through the real CLI (issue 37): 8 SIGKILLs of the
worker and 2 of the controller, each gated on a new committed checkpoint of the running
attempt and counted when it lands (tests/campaign_kit.py), with workers=1 and workers=2.
Every prompt's completion is published exactly once and token-identical to a clean run's,
with seeded sampling and checkpoints every 8 new tokens (mid-generation)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from campaign_kit import FAST, assert_landed, campaign
from genkit import build_model, prompts
from segue_helpers import Segue

pytest.importorskip("transformers", reason="the generate handler needs transformers: pip install 'segue[hf]'")
pytest.importorskip("torch", reason="the generate handler needs torch: pip install torch")

FLOW = str(Path(__file__).parent / "flows" / "generate_campaign.py")
N = 24
KW = {"max_new_tokens": 24, "batch_size": 4, "checkpoint_tokens": 8,
      "temperature": 0.8, "top_p": 0.95, "top_k": 40, "seed": 5}
KILLS, CONTROLLER_EVERY = 10, 5  # 8 of the worker, 2 of the controller


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny-lm") / "m")


def _published(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_generate_step_under_kills_publishes_each_completion_once_token_identical(
        tmp_path: Path, lm: Path, workers: int) -> None:
    ps = prompts(N)
    inp = tmp_path / "prompts.jsonl"
    inp.write_text("".join(json.dumps(p) + "\n" for p in ps))
    s = Segue(tmp_path / "home")
    s.env.update(FAST)
    cfg = {"path": str(lm), "workers": workers, "kw": KW}
    clean_out = tmp_path / "clean"
    s("run", FLOW, "--run-id", "clean", "-p", f"prompts={inp}", "-p", f"out={clean_out}",
      env={"GENCAMP": json.dumps(cfg)}, timeout=600, check=True)
    want = {r["id"]: r for r in _published(clean_out)}
    assert sorted(want) == sorted(p["id"] for p in ps)

    hold, out = tmp_path / "hold", tmp_path / "out"
    s.env["GENCAMP"] = json.dumps({**cfg, "hold": str(hold), "hold_id": ps[-1]["id"]})
    s("run", FLOW, "--run-id", "hit", "-p", f"prompts={inp}", "-p", f"out={out}", "--detach", check=True)
    done = campaign(s, "hit", hold, seed=workers, kills=KILLS, pauses=0,
                    controller_every=CONTROLLER_EVERY, timeout=780)
    assert_landed(done, KILLS, 0, CONTROLLER_EVERY)  # 8 worker and 2 controller SIGKILLs landed

    got = _published(out)
    ids = Counter(r["id"] for r in got)
    assert sorted(ids) == sorted(want) and set(ids.values()) == {1}, ids  # each once
    changed = [r["id"] for r in got if r["token_ids"] != want[r["id"]]["token_ids"]]
    assert not changed, f"{len(changed)} of {N} completions differ from the clean run: {changed}"
    assert sorted(got, key=lambda r: r["id"]) == [want[k] for k in sorted(want)]
