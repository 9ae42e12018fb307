"""KV-aware batching of the generate handler, and the bad input it refuses.

The bucketing itself (pure arithmetic), then on the tiny Llama: sub-batches that never
exceed the budget (read back from the handler's batch log and, in a real run through the
CLI, from the run's ``generate`` event), completions in input order and token-identical
to an unbucketed run, a resume from every checkpoint offer equal to the clean run, a
request too long for the budget dead-lettered with a one-line reason, bad requests
dead-lettered one by one, and bad handler arguments refused at submit (exit 2, one line).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genkit import build_model, prompts

from segue.data import Rejected
from segue.errors import UsageError
from segue.inference.kvbatch import KVBudget, bucket

FLOW = str(Path(__file__).parent / "flows" / "generate_budget.py")
SAMPLED = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "seed": 5}
LONG = {"id": "long", "prompt": " ".join(["word"] * 120)}


# -- the cut, pure ------------------------------------------------------------------------------
def test_bucket_sorts_by_length_and_cuts_under_the_budget() -> None:
    lengths = [9, 3, 30, 3, 12, 7, 200, 5]
    b = KVBudget(100)
    cut = bucket(lengths, 8, b)
    assert list(cut.too_long) == [6]
    assert re.match(r"^needs 208 tokens alone \(a prompt of 200 tokens \+ max_new_tokens 8\), above the batch "
                    r"budget of 100 tokens \(token_budget\); shorten the prompt or raise the budget$",
                    cut.too_long[6])
    flat = [i for g in cut.groups for i in g]
    assert flat == sorted((i for i in range(len(lengths)) if i != 6), key=lambda i: (lengths[i], i))
    for g in cut.groups:
        assert b.cost(len(g), max(lengths[i] for i in g), 8) <= 100
    # Greedy: each sub-batch but the last could not take the next request.
    for g, nxt in zip(cut.groups, cut.groups[1:], strict=False):
        assert b.cost(len(g) + 1, lengths[nxt[0]], 8) > 100
    assert bucket(lengths, 8, b) == cut  # only the lengths and the budget decide
    assert bucket(lengths, 8, None).groups == [list(range(len(lengths)))]  # no budget: as given
    assert bucket([], 8, b).groups == []


def test_a_byte_budget_counts_the_kv_cache_and_the_prefill() -> None:
    b = KVBudget(10_000, kv_per_token=10, act_per_token=100, source="kv_memory")
    assert b.cost(2, 20, 5) == 2 * 25 * 10 + 2 * 20 * 100
    assert b.unit == "bytes" and b.describe() == "10000 bytes (kv_memory)"
    cut = bucket([20, 20, 20, 20, 20], 5, b)
    assert [len(g) for g in cut.groups] == [4, 1]  # 4 x 2500 fits, 5 does not


def test_a_map_batches_function_sets_records_aside_with_rejected() -> None:
    from segue.data import operator

    records = [{"k": k} for k in range(5)]

    def fn(batch: list[dict[str, Any]]) -> list[Any]:
        return [Rejected(r, f"odd {r['k']}") if r["k"] % 2 else {"y": r["k"]} for r in batch]

    res = operator("map_batches", fn, batch_size=5).apply(records, False, True)
    assert res.outputs == [{"y": 0}, {"y": 2}, {"y": 4}]
    assert res.failures == [(1, records[1], "odd 1"), (3, records[3], "odd 3")]
    assert res.origins == [(0, 0), (0, 1), (0, 2)]


# -- on the tiny model ----------------------------------------------------------------------------
torch = pytest.importorskip("torch", reason="torch is not installed; `pip install segue[hf]`")
pytest.importorskip("transformers", reason="transformers is not installed; `pip install segue[hf]`")

from segue.inference.handlers import TransformersGenerateHandler  # noqa: E402
from segue.inference.unit import UnitState  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny-lm") / "m")


def _widths(h: TransformersGenerateHandler, m: Any, batch: list[dict[str, Any]]) -> list[int]:
    tok = m[0]
    return [len(tok(p["prompt"])["input_ids"]) for p in batch]


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_bucketed_batches_fit_the_budget_keep_the_order_and_the_tokens(lm: Path, mode: str) -> None:
    kw = SAMPLED if mode == "sampled" else {}
    plain = TransformersGenerateHandler(lm, max_new_tokens=12, device="cpu", **kw)
    m = plain.load_model()
    ps = prompts(10)
    want = plain.run_inference(ps, m)
    budget = 2 * (max(_widths(plain, m, ps)) + 12) + 5  # two of the longest fit, three do not
    h = TransformersGenerateHandler(lm, max_new_tokens=12, device="cpu", token_budget=budget, **kw)
    got = h.run_inference(ps + [LONG], m)
    assert [o["id"] for o in got[:-1]] == [p["id"] for p in ps]  # the input's order
    assert [o["token_ids"] for o in got[:-1]] == [o["token_ids"] for o in want]
    assert got[:-1] == want
    assert isinstance(got[-1], Rejected) and got[-1].record is LONG
    assert re.match(rf"^request 'long' needs \d+ tokens alone \(a prompt of \d+ tokens \+ max_new_tokens 12\), "
                    rf"above the batch budget of {budget} tokens \(token_budget\); shorten the prompt or raise "
                    rf"the budget$", got[-1].reason)
    report = h.segue_batch_report()
    assert report is not None
    log = report[1]
    assert log["too_long"] == 1 and log["requests"] == 10 and log["batches"] >= 4
    for rows, width, _ in log["shapes"]:
        assert rows * (width + 12) <= budget
    assert log["max_cost"] <= budget == log["budget"]["limit"]
    assert h.segue_batch_report() is None  # reported once


def test_a_resume_from_any_offer_of_a_bucketed_window_is_identical(lm: Path) -> None:
    """Offers come every chunk of tokens and at every sub-batch's end; a resume from each one
    (the saved state through JSON, as a checkpoint holds it) ends with the clean run's tokens."""
    ps = prompts(8)
    h = TransformersGenerateHandler(lm, max_new_tokens=20, device="cpu", checkpoint_tokens=8, token_budget=90,
                                    **SAMPLED)
    m = h.load_model()
    offers: list[dict[str, Any]] = []
    clean = h.run_resumable(ps, m, UnitState(None, lambda s: offers.append(json.loads(json.dumps(s)))))
    groups = h.segue_batch_report()[1]["batches"]  # type: ignore[index]
    assert groups >= 3 and len(offers) >= groups - 1
    # Sub-batches run one after the other: an offer holds finished requests of the earlier
    # ones, tokens so far of the one in flight, nothing of the later ones.
    assert any(any(v["finish"] for v in o.values()) and len(o) < len(ps) for o in offers)
    for saved in offers:
        assert h.run_resumable(ps, m, UnitState(saved, None)) == clean


def test_budgets_from_memory_use_the_planner_s_bytes_per_token(lm: Path, tmp_path: Path) -> None:
    from segue.inference.models import load_config
    from segue.inference.plan import kv_bytes_per_token

    cfg = load_config(lm)
    kv = kv_bytes_per_token(cfg, "fp32")
    h = TransformersGenerateHandler(lm, device="cpu", kv_memory=200 * kv)
    m = h.load_model()
    b = h.kv_budget(m[1])
    assert b is not None and (b.limit, b.kv_per_token, b.source) == (200 * kv, kv, "kv_memory")
    assert b.act_per_token > kv  # the prefill's activations and logits per prompt token
    auto = TransformersGenerateHandler(lm, device="cpu", token_budget="auto").kv_budget(m[1])
    assert auto is not None and auto.source.startswith("device: ") and auto.limit > 10**8
    from segue.inference import gpus
    from segue.inference.plan import plan

    p = plan(cfg, "bf16", gpus.custom(2 * 10**9), context=256, batch=4)
    planned = TransformersGenerateHandler(lm, device="cpu", plan=p).kv_budget(m[1])
    assert planned is not None and planned.source == "plan"
    assert planned.kv_per_token == kv_bytes_per_token(cfg, "bf16") == kv // 2
    assert planned.limit == p.capacity_bytes - p.memory.slack - p.memory.cuda_context - p.memory.weights
    # A measured profile of this handler in the home wins over the device's capacity.
    from segue.inference.profiles import save_profile

    home = tmp_path / "home"
    save_profile(home, {"v": 1, "handler": "transformers-generate", "version": "1", "device_type": "cpu",
                        "batches": [{"batch_size": 1, "peak_bytes": 3 * 10**6}],
                        "capacity_bytes": 10**7, "memory_after_load_bytes": 2 * 10**6})
    prof = TransformersGenerateHandler(lm, device="cpu", token_budget="auto").kv_budget(m[1], str(home))
    assert prof is not None and (prof.limit, prof.source) == (7 * 10**6, "profile")


def test_bad_budgets_are_refused_with_one_line(lm: Path, tmp_path: Path) -> None:
    who = r"^handler 'transformers-generate': "
    with pytest.raises(UsageError, match=who + r"token_budget 64 leaves no room for a prompt: it must be above "
                                               r"max_new_tokens 64$"):
        TransformersGenerateHandler(lm, token_budget=64)
    with pytest.raises(UsageError, match=who + r"token_budget must be an int \(tokens\) or 'auto', not 'lots'$"):
        TransformersGenerateHandler(lm, token_budget="lots")
    with pytest.raises(UsageError, match=who + r"give one of token_budget, kv_memory and plan, not token_budget "
                                               r"and kv_memory$"):
        TransformersGenerateHandler(lm, token_budget=500, kv_memory="1GB")
    with pytest.raises(UsageError, match=who + r"kv_memory"):
        TransformersGenerateHandler(lm, kv_memory="lots")
    bare = tmp_path / "noconfig"
    shutil.copytree(lm, bare)
    (bare / "config.json").unlink()
    with pytest.raises(UsageError, match=who + r"the KV budget needs the model's config.json: no config.json"):
        TransformersGenerateHandler(bare, token_budget="auto")


# -- real processes: the CLI ------------------------------------------------------------------------
def _write(path: Path, records: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _read(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]


def _run(segue: Any, tmp_path: Path, name: str, inp: str, kw: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    out = tmp_path / f"out-{name}"
    proc = segue("run", FLOW, "--run-id", name, "-p", f"prompts={inp}", "-p", f"out={out}",
                 env={"SEGUE_TEST_GEN": json.dumps(kw)}, timeout=400)
    assert proc.returncode == 0, proc.stderr
    return _read(out), proc


@pytest.mark.timeout(900)
def test_a_bucketed_run_dead_letters_what_cannot_run_and_matches_an_unbucketed_one(
        segue: Any, tmp_path: Path, lm: Path) -> None:
    ps = prompts(12)
    bad = [{"id": "noprompt", "text": "x"}, {"id": "number", "prompt": 5}, LONG]
    records = ps[:5] + [bad[0]] + ps[5:9] + [bad[1], bad[2]] + ps[9:]
    inp = _write(tmp_path / "prompts.jsonl", records)
    base = {"path": str(lm), "max_new_tokens": 16, "batch_size": 8, "checkpoint_tokens": 8, **SAMPLED}
    budget = 100
    bucketed, _ = _run(segue, tmp_path, "bucketed", inp, {**base, "token_budget": budget})
    plain, _ = _run(segue, tmp_path, "plain", inp, base)
    assert [r["id"] for r in bucketed] == [p["id"] for p in ps]  # the input's order, once each
    assert [r for r in plain if r["id"] != "long"] == bucketed  # token for token, the same records

    def dead(run: str) -> list[dict[str, Any]]:
        files = sorted((segue.home / "dead-letter" / run / "generate").glob("dead-*.jsonl"))
        return [json.loads(line) for p in files for line in p.read_text().splitlines()]

    rows = dead("bucketed")
    assert [r["record"] for r in rows] == bad and [r["ordinal"] for r in rows] == [5, 10, 11]
    assert [r["error"].split(":")[0] for r in rows[:2]] == ["request 'noprompt' has no 'prompt' field",
                                                             "request 'number'"]
    assert re.match(rf"^request 'long' needs \d+ tokens alone .* above the batch budget of {budget} tokens "
                    rf"\(token_budget\); shorten the prompt or raise the budget$", rows[2]["error"])
    assert all("\n" not in r["error"] for r in rows)
    assert [r["record"] for r in dead("plain")] == bad[:2]  # without a budget the long one runs
    assert segue.step("bucketed", "generate")["state"] == "SUCCEEDED"

    events = [e for e in segue.events("bucketed") if e["kind"] == "generate"]
    assert len(events) == 1, events
    log = events[0]["data"]
    assert log["budget"]["limit"] == budget and log["too_long"] == 1 and log["requests"] == len(ps)
    assert log["batches"] > 2  # the budget cut the windows of 8
    for rows_n, width, _ in log["shapes"]:
        assert rows_n * (width + 16) <= budget, (rows_n, width)
    plain_log = next(e for e in segue.events("plain") if e["kind"] == "generate")["data"]
    assert plain_log["budget"] is None and plain_log["batches"] == 2


@pytest.mark.timeout(300)
def test_bad_handler_arguments_and_model_directories_exit_2_at_submit(
        segue: Any, tmp_path: Path, lm: Path) -> None:
    inp = _write(tmp_path / "prompts.jsonl", prompts(2))
    notok = tmp_path / "no-tokenizer"
    notok.mkdir()
    shutil.copy(lm / "config.json", notok / "config.json")
    shutil.copy(lm / "model.safetensors", notok / "model.safetensors")
    notemplate = tmp_path / "no-template"
    notemplate.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(lm / f, notemplate / f)
    cases = [
        ({"path": str(lm), "max_new_tokens": 0}, r"max_new_tokens must be an int >= 1, not 0"),
        ({"path": str(notemplate), "chat": True}, r"chat=True but the tokenizer in .*no-template has no chat "
                                                  r"template; give plain prompts \(chat=False\) or add a "
                                                  r"chat_template"),
        ({"path": str(notok)}, r".*no-tokenizer has no tokenizer \(tokenizer.json or tokenizer_config.json\); "
                               r"save the tokenizer next to the model"),
        ({"path": str(lm), "token_budget": 10}, r"token_budget 10 leaves no room for a prompt"),
    ]
    for n, (kw, why) in enumerate(cases):
        out = tmp_path / f"out-{n}"
        proc = segue("run", FLOW, "--run-id", f"bad{n}", "-p", f"prompts={inp}", "-p", f"out={out}",
                     env={"SEGUE_TEST_GEN": json.dumps(kw)})
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (kw, proc.stderr)
        assert len(lines) == 1 and re.search(r"handler 'tiny-llama': " + why, lines[0]), lines
        assert not out.exists()
